"""Strategies under data parallelism: two CPU processes (gloo) against one process.

Each group of strategies trains in three processes started here: two ranks of one DDP process
group (launched the way torchrun or srun would, one process per rank, so several Trainers share
the group) and one single process. The ranks read their shards through the runner's
:func:`clbench.data.datasets.run_loader` at per-rank batch b; the single process reads the same data at
batch 2b. Every global batch splits into equal halves, so mean losses average to the global
batch's and the definition of every strategy here is "the same steps as one process on the
global batch". Checked for each strategy:

* the ranks end bit-identical: weights, buffers and strategy state; and the model is identical
  right after ``setup`` and after the last ``before_experience`` (adapters, experts and grown
  layers are created the same on every rank, before DDP's start-up broadcast could hide a
  difference);
* the ranks equal the single process to float tolerance (summation order differs between the
  halves and the whole: 1e-5 absolute, 1e-4 relative).

Run as a script, this file is the worker: ``python test_ddp_strategies.py GROUP OUT``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parents[1]
PER_RANK_BATCH = 4  # classic group; the single process uses 2 x this
LM_PER_RANK_BATCH = 2
ATOL, RTOL = 1e-5, 1e-4

pytestmark = pytest.mark.slow


# -- the strategies and their data -----------------------------------------------------------
def classic(name: str):
    from clbench.strategies.agem import AGEM
    from clbench.strategies.cumulative import Cumulative
    from clbench.strategies.ewc import EWC
    from clbench.strategies.gem import GEM
    from clbench.strategies.grow import Grow
    from clbench.strategies.joint import Joint
    from clbench.strategies.lwf import LwF
    from clbench.strategies.naive import Naive
    from clbench.strategies.gdumb import GDumb
    from clbench.strategies.mas import MAS
    from clbench.strategies.replay import Replay
    from clbench.strategies.si import SI

    return {"naive": lambda: Naive(), "cumulative": lambda: Cumulative(), "joint": lambda: Joint(),
            "replay": lambda: Replay(mem_size=10), "ewc": lambda: EWC(ewc_lambda=1.0),
            "lwf": lambda: LwF(), "agem": lambda: AGEM(patterns_per_experience=10, sample_size=6),
            "gem": lambda: GEM(patterns_per_experience=8), "grow": lambda: Grow(top_n=1, probe_steps=2,
                                                                               probe_batch_size=8),
            "si": lambda: SI(c=1.0), "mas": lambda: MAS(), "gdumb": lambda: GDumb(mem_size=12)}[name]()


def language(name: str):
    from clbench.strategies.lora import SeqLoRA
    from clbench.strategies.moe_lora import LoRAMoE, MHMoE
    from clbench.strategies.moses import MoSEs
    from clbench.strategies.o_lora import OLoRA

    return {"seq_lora": lambda: SeqLoRA(r=2, dropout=0.0), "o_lora": lambda: OLoRA(r=2, dropout=0.0),
            "loramoe": lambda: LoRAMoE(r=2), "mh_moe": lambda: MHMoE(r=2, heads=2),
            "moses": lambda: MoSEs(r=2)}[name]()


GROUPS = {"classic": ["naive", "cumulative", "joint", "replay", "ewc", "lwf", "agem", "gem", "grow", "si", "mas",
                      "gdumb"],
          "lm": ["seq_lora", "o_lora", "loramoe", "mh_moe", "moses"]}


def lm_records(task: int, n: int) -> list[dict]:
    """Single-digit answers: every sample has the same number of target tokens, so a per-token
    mean over half a batch averages to the whole batch's."""
    import random

    rng = random.Random(10 * task)
    out = []
    for _ in range(n):
        a, b = rng.randrange(5), rng.randrange(5)
        out.append({"prompt": f"Add {a} and {b}. Answer:", "answer": str(a + b)} if task == 0 else
                   {"prompt": f"Halve {2 * a}. Answer:", "answer": str(a)})
    return out


def setup_group(group: str, name: str):
    """(strategy, module, experiences, per-rank batch, epochs) of one strategy of ``group``:
    ``classic`` on a tiny classifier, ``lm`` on a tiny Qwen3, ``lm-full`` a classic strategy
    (every weight trained) on the tiny Qwen3."""
    from clbench.engine.module import ContinualModule

    torch.manual_seed(0)
    if group == "classic":
        from helpers import make_experience, tiny_model

        strategy = classic(name)
        experiences = [make_experience(0, [0, 1, 2, 3] * 10), make_experience(1, [3, 2, 1, 0] * 12)]
        module = ContinualModule(tiny_model(), strategy, num_classes=4, num_columns=1,
                                 optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
        strategy.setup(module.context, experiences, 0)
        strategy.adapt_model(module.context, 0)
        return strategy, module, experiences, PER_RANK_BATCH, 2
    from lm_helpers import build, lm

    from clbench.data.streams import Experience

    experiences = [Experience(position=t, name=f"task{t}", domain_id=t, classes=[], train=lm_records(t, 8),
                              test=lm_records(t, 2)) for t in range(2)]
    strategy = language(name) if group == "lm" else classic(name)
    module = build(strategy, experiences, lm())
    module.make_optimizer = lambda params: torch.optim.SGD(params, lr=0.05)
    return strategy, module, experiences, LM_PER_RANK_BATCH, 1


# -- the worker ------------------------------------------------------------------------------
def train_one(group: str, name: str, world: int, rank: int, sharded: bool = False, inspect=None) -> dict:
    """Train on every experience; the model's state after setup, after the last
    ``before_experience`` and at the end (whole tensors: gathered on rank 0 when ``sharded``),
    and the strategy's. ``inspect(module)`` may add entries at the end."""
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import ModelParallelStrategy

    from clbench import seeding
    from clbench.data.datasets import run_loader
    from clbench.engine.sharding import model_state

    strategy, module, experiences, batch, epochs = setup_group(group, name)
    batch = batch * (2 // world)  # one process reads the global batch
    cfg = {"train": {"batch_size": batch, "eval_batch_size": batch, "num_workers": 0},
           "trainer": {"accelerator": "cpu"}}
    collate = module.objective.collate(train=True)

    def make(ds, **kw):
        return run_loader(cfg, ds, shuffle=True, seed=kw.pop("seed", 7), world_size=world, rank=rank,
                          collate_fn=kw.pop("collate_fn", collate), **kw)

    def snapshot() -> dict:
        return {k: v.detach().clone() for k, v in model_state(module.model).items()}

    parallel = ModelParallelStrategy() if sharded else "ddp"
    extra = {"devices": 2, "strategy": parallel} if world > 1 else {"devices": 1}
    trainer = pl.Trainer(max_epochs=0, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                         num_sanity_val_steps=0, **extra)
    initial = snapshot()  # after setup
    created = None
    for stage, exp in enumerate(experiences):
        seeding.seed_all(seeding.derive(0, "train", stage))  # as the runner does
        strategy.adapt_model(module.context, exp.position + 1)
        strategy.before_experience(module.context, exp)
        created = snapshot()
        loader = strategy.train_loader(module.context, strategy.train_dataset(exp), make)
        trainer.fit_loop.max_epochs = trainer.current_epoch + epochs
        trainer.fit(module, train_dataloaders=loader)
        strategy.after_experience(module.context, exp)
    out = {"setup": initial, "created": created, "model": snapshot(), "state": strategy.state_dict()}
    return {**out, **(inspect(module) if inspect else {})}


def worker(group: str, out: str) -> None:
    import warnings

    from clbench.engine.trainer import end_process_group, quiet_lightning

    quiet_lightning()
    warnings.filterwarnings("ignore")
    world = 2 if "LOCAL_RANK" in os.environ else 1
    rank = int(os.environ.get("LOCAL_RANK", 0))
    results = {name: train_one(group, name, world, rank) for name in GROUPS[group]}
    torch.save(results, Path(out) / f"{group}-w{world}-r{rank}.pt")
    end_process_group()  # else gloo may abort at exit


# -- the tests -------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(group: str, out: Path) -> dict[str, dict]:
    """Both ranks and the single process at once; returns their results by tag."""
    base = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE")}
    base.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(TESTS.parent), str(TESTS)]))
    port = str(free_port())
    envs = [dict(base, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK="0", LOCAL_RANK=str(r)) for r in range(2)]
    procs = [subprocess.Popen([sys.executable, __file__, group, str(out)], env=env, cwd=out,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for env in [*envs, base]]
    logs = [p.communicate(timeout=400)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return {tag: torch.load(out / f"{group}-{tag}.pt", weights_only=True) for tag in ("w2-r0", "w2-r1", "w1-r0")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cache: dict[str, dict] = {}

    def get(group: str) -> dict:
        if group not in cache:
            cache[group] = launch(group, tmp_path_factory.mktemp(group))
        return cache[group]
    return get


def leaves(obj, path="") -> dict[str, object]:
    """Flattened ``{path: value}`` of nested dicts and lists; probe timings left out."""
    if isinstance(obj, dict):
        return {k: v for key in sorted(obj, key=str) if key != "probe_seconds"
                for k, v in leaves(obj[key], f"{path}/{key}").items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, item in enumerate(obj) for k, v in leaves(item, f"{path}/{i}").items()}
    return {path: obj}


def same(a, b, exact: bool) -> list[str]:
    """Paths where ``a`` and ``b`` differ (bit for bit, or beyond the tolerance)."""
    a, b = leaves(a), leaves(b)
    if a.keys() != b.keys():
        return [f"keys differ: {sorted(a.keys() ^ b.keys())[:5]}"]
    bad = []
    for key, x in a.items():
        y = b[key]
        if torch.is_tensor(x) and torch.is_tensor(y):
            ok = x.shape == y.shape and (torch.equal(x, y) if exact or not x.is_floating_point()
                                         else torch.allclose(x.double(), y.double(), atol=ATOL, rtol=RTOL))
        elif isinstance(x, float) and isinstance(y, float) and not exact:
            ok = abs(x - y) <= ATOL + RTOL * abs(y)
        else:
            ok = x == y
        if not ok:
            bad.append(key)
    return bad


@pytest.mark.parametrize("group,name", [(g, n) for g, names in GROUPS.items() for n in names],
                         ids=[n for names in GROUPS.values() for n in names])
def test_two_ranks_stay_identical_and_match_one_process(group, name, runs):
    results = runs(group)
    r0, r1, single = (results[tag][name] for tag in ("w2-r0", "w2-r1", "w1-r0"))
    for part in ("setup", "created", "model", "state"):
        assert not same(r0[part], r1[part], exact=True), f"{part}: ranks differ at {same(r0[part], r1[part], True)[:5]}"
        diff = same(r0[part], single[part], exact=False)
        assert not diff, f"{part}: two ranks differ from one process at {diff[:5]}"
    moved = [k for k, v in r0["model"].items() if k in r0["created"] and v.shape == r0["created"][k].shape
             and not torch.equal(v, r0["created"][k])]
    assert moved, "the last experience trained nothing"


def test_a_two_process_digits_run_gives_the_one_process_r_matrix(tmp_path, write_yaml):
    """The runner end to end: ``trainer: {devices: 2, strategy: ddp}`` at ``train.batch_size``
    32 against one process at 64. ``batch_size`` is per process, and each rank's training shard
    splits the single-process order (:class:`clbench.data.datasets.ShardedSampler`), so with an even
    training set (1346 samples per domain: every global batch, the last one of 2 included,
    halves evenly), a naive MLP without dropout or batch norm and the same seeds, both runs take
    the same steps; evaluation shards are summed exactly. Only float summation order differs
    (the gradient of a 64-batch versus the mean of two 32-batch gradients), far below a
    prediction flip: R must match to 1e-6, which is under one test sample in 450.

    The two-process runs use naive with a broadcast in ``before_experience``
    (``tests/collective_strategy.py``): the resumed run's first stage reaches it before any
    fit, so it fails unless the runner starts the process group first."""
    import json

    from helpers import kill_env, run_cli, tiny_config

    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    even = {"benchmark": {"init_args": {"test_fraction": 0.2505}}}  # 1346 training, 451 test samples per domain
    single = run(resolve_config(tiny_config(**even, train={"epochs": 2, "batch_size": 64})), None)
    cfg = tiny_config(**even, train={"epochs": 2, "batch_size": 32},
                      strategy={"class_path": "collective_strategy.CollectiveNaive", "init_args": {"world": 2}},
                      trainer={"accelerator": "cpu", "devices": 2, "strategy": "ddp"})
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = run_cli("run", "--config", str(write_yaml(cfg)), "--output", str(tmp_path / "ddp"), "--no-progress",
                   env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr  # the process group is torn down before exit
    result = json.loads((tmp_path / "ddp" / "result.json").read_text())
    assert result["r_init"] == single["r_init"]
    assert torch.allclose(torch.tensor(result["r_matrix"]), torch.tensor(single["r_matrix"]), atol=1e-6, rtol=0)

    # a node loss: every rank killed in the middle of the second experience; --resume continues
    # from rank 0's checkpoint on both ranks and ends where the uninterrupted run ended
    killed = run_cli("run", "--config", str(write_yaml(cfg)), "--output", str(tmp_path / "killed"), "--no-progress",
                     env=kill_env("stage:1:step:3", env))
    assert killed.returncode != 0 and (tmp_path / "killed" / "checkpoint.pt").is_file()
    assert not (tmp_path / "killed" / "result.json").exists()
    resumed = run_cli("run", "--config", str(write_yaml(cfg)), "--output", str(tmp_path / "killed"), "--resume",
                      "--no-progress", env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = json.loads((tmp_path / "killed" / "result.json").read_text())
    assert again["r_matrix"] == result["r_matrix"] and again["compute"]["resumes"] == 1


if __name__ == "__main__":
    sys.path[:0] = [str(TESTS.parent), str(TESTS)]
    worker(sys.argv[1], sys.argv[2])
