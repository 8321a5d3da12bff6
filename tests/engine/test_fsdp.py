"""Sharded parameters (``trainer.strategy: fsdp``, FSDP2 on a CPU device mesh with gloo).

Two ranks shard the tiny Qwen3 model (each decoder block a unit) and train it with each
strategy that ``supports_sharded``; one process trains the same model unsharded
on the global batch (the ranks' per-rank batch twice over). As under DDP
(``test_ddp_strategies``), the definition is "the same steps as one process on the global
batch", so the gathered weights must equal the single process's to float tolerance, and the
frozen base must be bit-identical to the weights it started from. The runner is then run end
to end under ``clbench run``: evaluation shards of unequal length (the ranks must run equally
many forwards: the shorter one evaluates a padding batch), generations gathered, a checkpoint
gathered from the shards, and ``--resume`` after every rank was killed.

Run as a script, this file is the worker: ``python test_fsdp.py OUT``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parents[1]
FULL = ["naive", "replay", "cumulative", "joint"]  # every weight trained
STRATEGIES = ["seq_lora", "o_lora", "loramoe", "mh_moe", *FULL]
ATOL, RTOL = 1e-5, 1e-4

pytestmark = pytest.mark.slow


# -- the worker ------------------------------------------------------------------------------
def inspect(module) -> dict:
    """How the model is sharded, and whether a parameter added late is refused."""
    from torch.distributed.tensor import DTensor

    from clbench.engine.sharding import is_sharded

    if not is_sharded(module.model):
        return {"sharded": False}
    block = next(p for n, p in module.model.named_parameters() if "layers.0.mlp" in n and p.ndim == 2)
    out = {"sharded": True, "rows": block.shape[0],
           "local_rows": block.to_local().shape[0] if isinstance(block, DTensor) else -1}
    try:  # a parameter added after sharding is refused at the next fit or evaluation
        module.model.hf.extra = torch.nn.Linear(2, 2)
        module.configure_model()
        out["late_parameter"] = "accepted"
    except RuntimeError as err:
        out["late_parameter"] = str(err)
    return out


def worker(out: str) -> None:
    import warnings

    from test_ddp_strategies import train_one

    from clbench.engine.trainer import end_process_group, quiet_lightning

    quiet_lightning()
    warnings.filterwarnings("ignore")
    world = 2 if "LOCAL_RANK" in os.environ else 1
    rank = int(os.environ.get("LOCAL_RANK", 0))
    results = {name: train_one("lm-full" if name in FULL else "lm", name, world, rank, sharded=world > 1,
                               inspect=inspect) for name in STRATEGIES}
    torch.save(results, Path(out) / f"w{world}-r{rank}.pt")
    end_process_group()


# -- the tests -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from test_ddp_strategies import free_port

    out = tmp_path_factory.mktemp("fsdp")
    base = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE")}
    base.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(TESTS.parent), str(TESTS)]))
    port = str(free_port())
    envs = [dict(base, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK="0", LOCAL_RANK=str(r)) for r in range(2)]
    procs = [subprocess.Popen([sys.executable, __file__, str(out)], env=env, cwd=out, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for env in [*envs, base]]
    logs = [p.communicate(timeout=500)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return {tag: torch.load(out / f"{tag}.pt", weights_only=True) for tag in ("w2-r0", "w2-r1", "w1-r0")}


@pytest.mark.parametrize("name", STRATEGIES)
def test_sharded_ranks_train_what_one_process_trains_on_the_global_batch(name, runs):
    from test_ddp_strategies import same

    sharded, other, single = runs["w2-r0"][name], runs["w2-r1"][name], runs["w1-r0"][name]
    assert sharded["sharded"] and not single["sharded"]
    assert sharded["local_rows"] * 2 == sharded["rows"] == other["local_rows"] * 2  # each rank holds half
    assert other["model"] == {}  # the whole weights are gathered on rank 0 only
    assert sharded["model"].keys() == single["model"].keys()
    for part in ("created", "state"):  # adapters and experts made as in one process
        assert not same(sharded[part], single[part], exact=False), part
    far = [k for k, v in sharded["model"].items()
           if not torch.allclose(v.double(), single["model"][k].double(), atol=ATOL, rtol=RTOL)]
    assert not far, f"sharded training differs from one process at {far[:5]}"
    start = sharded["setup"]
    moved = [k for k, v in sharded["model"].items() if k not in start or not torch.equal(v, start[k])]
    assert any(torch.count_nonzero(sharded["model"][k]) for k in moved), "nothing trained"
    # what one process left untouched (a frozen base), sharding and gathering left bit-identical
    kept = [k for k, v in single["model"].items() if k in single["setup"] and torch.equal(v, single["setup"][k])]
    assert (name in FULL or kept) and all(torch.equal(sharded["model"][k], sharded["setup"][k]) for k in kept)
    assert "added after the model was sharded" in sharded["late_parameter"]


def lm_config() -> dict:
    """seq_lora on trace-mini: 5 test prompts per task at evaluation batch 2, so rank 0's shard
    has 2 batches and rank 1's 1 (plus a padding batch under sharding). Py150 is scored by edit
    similarity, which the tiny model's generations do not leave at zero, so R compares scores
    rather than zeros; FOMC's short labels keep its generations non-empty."""
    from lm_helpers import lm_config as base

    cfg = base({"class_path": "seq_lora", "init_args": {"r": 4, "dropout": 0.0}})
    cfg["benchmark"]["init_args"].update(tasks=["FOMC", "Py150"], n_train=16, n_test=5)
    cfg["train"].update(epochs=3, batch_size=4, eval_batch_size=2)
    cfg["train"]["optimizer"]["init_args"]["lr"] = 0.02
    return cfg


def run_two_processes(config: Path, out: Path, *more: str) -> dict:
    """``clbench run`` of a two-process config (its ``trainer:`` says so); its result.json."""
    from helpers import run_cli

    proc = run_cli("run", "--config", str(config), "--output", str(out), "--no-progress", *more,
                   env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr  # the process group is torn down before exit
    return json.loads((out / "result.json").read_text())


def test_a_sharded_run_equals_ddp_checkpoints_gathered_weights_and_resumes(tmp_path, write_yaml):
    """``clbench run`` with ``trainer: {devices: 2, strategy: fsdp}`` against the same run under
    DDP (the same per-rank batches, so the same steps, and gradients clipped by the same global
    norm: clipping acts on every step at 0.05): the same R, the same generations (every
    test prompt once, none from the padding batch). Killed on every rank in the second
    experience, the sharded run leaves a checkpoint of adapter weights gathered from the shards
    (the frozen base left out) from which it resumes to the uninterrupted R exactly: a shard
    lost or misplaced in the gathering would train on from other weights. Pretraining and
    the reference models (``metrics.reference_models``: the pretrained plain model trained on
    one experience alone) run sharded too, to DDP's scores."""
    from helpers import kill_env, run_cli

    from clbench.engine.checkpoint import CHECKPOINT

    results, configs = {}, {}
    for kind in ("ddp", "fsdp"):
        trainer = {"accelerator": "cpu", "devices": 2, "strategy": kind, "gradient_clip_val": 0.05}
        cfg = lm_config()
        cfg["metrics"]["reference_models"] = True
        cfg["pretrain"] = {"fraction": 0.25, "epochs": 1}
        configs[kind] = write_yaml({**cfg, "trainer": trainer}, f"{kind}.yaml")
        results[kind] = run_two_processes(configs[kind], tmp_path / kind)
    ddp, fsdp = results["ddp"], results["fsdp"]
    assert fsdp["r_init"] == ddp["r_init"]
    assert torch.allclose(torch.tensor(fsdp["r_matrix"]), torch.tensor(ddp["r_matrix"]), atol=1e-6, rtol=0)
    assert any(any(row) for row in fsdp["r_matrix"]) and any(fsdp["reference"])  # not all zeros
    assert fsdp["reference"] == pytest.approx(ddp["reference"], abs=1e-6)
    said = []
    for task in fsdp["experiences"]:
        rows = [json.loads(line) for line in (tmp_path / "fsdp" / "predictions" / f"{task}.jsonl").open()]
        alone = [json.loads(line) for line in (tmp_path / "ddp" / "predictions" / f"{task}.jsonl").open()]
        assert len(rows) == 5 and [(r["prompt"], r["prediction"]) for r in rows] == \
            [(r["prompt"], r["prediction"]) for r in alone]
        said += [r["prediction"] for r in rows]
    assert any(said)  # the model says something: generations are compared, not ""

    killed = run_cli("run", "--config", str(configs["fsdp"]), "--output", str(tmp_path / "fsdp-killed"),
                     "--no-progress", env=kill_env("stage:1:step:1", {"OMP_NUM_THREADS": "1"}))
    assert killed.returncode != 0
    gathered = torch.load(tmp_path / "fsdp-killed" / CHECKPOINT, weights_only=True)["model"]
    assert gathered and all("lora_" in k for k in gathered)  # no frozen base
    again = run_two_processes(configs["fsdp"], tmp_path / "fsdp-killed", "--resume")
    assert again["r_matrix"] == fsdp["r_matrix"] and again["compute"]["resumes"] == 1


def test_a_test_set_smaller_than_the_processes_leaves_ranks_empty_shards(tmp_path, write_yaml):
    """One test prompt per task and two processes: under DDP rank 1's evaluation loaders are
    empty, under FSDP they hold one padding batch; both score the untrained model as one process
    does, each prompt once."""
    from clbench.engine.runner import run

    cfg = lm_config()
    cfg["benchmark"]["init_args"].update(n_train=8, n_test=1)
    cfg["train"]["epochs"] = 1
    single = run(cfg, tmp_path / "single")
    for kind in ("ddp", "fsdp"):
        config = write_yaml({**cfg, "trainer": {"accelerator": "cpu", "devices": 2, "strategy": kind}}, f"{kind}.yaml")
        result = run_two_processes(config, tmp_path / kind)
        assert result["r_init"] == single["r_init"], kind
        for task in result["experiences"]:
            rows = (tmp_path / kind / "predictions" / f"{task}.jsonl").read_text().splitlines()
            assert len(rows) == 1, kind


def test_lightning_precision_applies_under_sharding_as_under_ddp(tmp_path, write_yaml):
    """``trainer.precision: bf16-mixed`` (autocast, on the CPU here) reaches the sharded model as
    it reaches DDP's: the same R under both, and not the float32 R (the control: one process on
    the global batch, the same steps, in this process). Both decode each loader batch as it
    comes (sharded parameters always do), so that bf16's rounding sees the same batches."""
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    results = {}
    cfg = lm_config()
    cfg["objective"]["init_args"]["pool_generation"] = False
    for kind in ("ddp", "fsdp"):
        trainer = {"accelerator": "cpu", "devices": 2, "strategy": kind, "precision": "bf16-mixed"}
        config = write_yaml({**cfg, "trainer": trainer}, f"{kind}.yaml")
        results[kind] = torch.tensor(run_two_processes(config, tmp_path / kind)["r_matrix"])
    single = {**cfg, "trainer": {**cfg["trainer"], "precision": "32-true"},
              "train": {**cfg["train"], "batch_size": 2 * cfg["train"]["batch_size"]}}
    fp32 = torch.tensor(run(resolve_config(single), tmp_path / "fp32")["r_matrix"])
    assert torch.allclose(results["fsdp"], results["ddp"], atol=1e-6, rtol=0)
    assert not torch.allclose(results["fsdp"], fp32, atol=1e-6, rtol=0)


if __name__ == "__main__":
    sys.path[:0] = [str(TESTS.parent), str(TESTS)]
    worker(sys.argv[1])
