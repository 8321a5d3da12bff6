"""The continual loop: R matrix layout, determinism, strategies by import path, per-epoch eval."""

import json
import math
import textwrap

import pytest

from clbench.config.load import resolve_config
from clbench.engine.runner import run
from helpers import tiny_config


@pytest.fixture(scope="module")
def naive_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("naive")
    return run(resolve_config(tiny_config()), out), out


def test_result_json_has_the_documented_fields(naive_result):
    result, out = naive_result
    on_disk = json.loads((out / "result.json").read_text())
    assert on_disk == json.loads(json.dumps(result))
    for key in ("schema", "benchmark", "model", "strategy", "seed", "order", "experiences", "r_matrix", "r_init",
                "scores", "config_hash", "env", "compute"):
        assert key in on_disk, key
    assert on_disk["experiences"] == ["rot0", "rot90", "rot180"]
    assert len(on_disk["r_matrix"]) == 3 and all(len(row) == 3 for row in on_disk["r_matrix"])
    assert len(on_disk["r_init"]) == 3
    for key in ("acc", "aia", "bwt", "fwt", "forgetting"):
        assert key in on_disk["scores"]
    assert on_disk["strategy"]["name"] == "naive"
    assert on_disk["env"]["packages"]["torch"]
    assert on_disk["compute"]["wall_seconds"] > 0
    assert not (out / "checkpoint.pt").exists()  # removed once the result is written


def test_scores_follow_from_the_matrix(naive_result):
    result, _ = naive_result
    r = result["r_matrix"]
    assert result["scores"]["acc"] == pytest.approx(sum(r[-1]) / 3)
    assert result["scores"]["bwt"] == pytest.approx(((r[2][0] - r[0][0]) + (r[2][1] - r[1][1])) / 2)
    # the untrained model is near chance on 10 balanced classes, the trained one is not
    assert max(result["r_init"]) < 0.35 and r[0][0] > 0.5


def test_same_config_and_seed_gives_identical_r_matrix(naive_result):
    again = run(resolve_config(tiny_config()), None)
    assert again["r_matrix"] == naive_result[0]["r_matrix"]
    other_seed = run(resolve_config(tiny_config(seed=1)), None)
    assert other_seed["r_matrix"] != naive_result[0]["r_matrix"]


def test_order_is_applied(naive_result):
    result = run(resolve_config(tiny_config(order=["rot180", "rot0", "rot90"])), None)
    assert result["experiences"] == ["rot180", "rot0", "rot90"]


def test_joint_trains_once_on_everything():
    result = run(resolve_config(tiny_config(strategy={"class_path": "joint"})), None)
    assert len(result["r_matrix"]) == 1 and len(result["r_matrix"][0]) == 3
    assert result["scores"]["bwt"] is None and result["scores"]["acc"] > 0.5


def test_per_epoch_evaluation_gives_the_epoch_matrix():
    cfg = resolve_config(tiny_config(train={"epochs": 2, "eval_every_epoch": True}))
    result = run(cfg, None)
    assert len(result["r_epochs"]) == 6 and result["epoch_stage"] == [0, 0, 1, 1, 2, 2]
    # the row of each experience is its last epoch's row (no second evaluation pass)
    assert [result["r_epochs"][k] for k in (1, 3, 5)] == result["r_matrix"]
    assert len(result["epoch_scores"]) == 6


def test_strategy_from_a_file_outside_the_package(tmp_path, write_yaml):
    plugin = tmp_path / "elsewhere" / "my_strategy.py"
    plugin.parent.mkdir()
    plugin.write_text(textwrap.dedent('''
        import torch
        from clbench.strategy import Strategy

        class FrozenAfterFirst(Strategy):
            """Trains the first experience only, then freezes every parameter."""

            def __init__(self, note: str = "x"):
                super().__init__()
                self.note = note
                self.frozen = False

            def before_experience(self, ctx, experience):
                if experience.position > 0:
                    self.frozen = True

            def training_loss(self, ctx, x, y, logits, loss):
                return loss * 0.0 if self.frozen else loss
    '''))
    cfg = resolve_config(tiny_config(strategy={"class_path": f"{plugin}:FrozenAfterFirst",
                                               "init_args": {"note": "y"}}))
    result = run(cfg, None)
    r = result["r_matrix"]
    assert r[1] == r[0] == r[2]  # nothing changed after the first experience
    assert result["strategy"]["params"] == {"note": "y"}
    assert result["strategy"]["class"].endswith(":FrozenAfterFirst")


def test_ddp_two_cpu_processes_count_every_test_sample_once(tmp_path, write_yaml):
    """Under DDP (2 gloo processes) evaluation shards are never padded: the untrained model's
    scores equal the single-process ones exactly, on test sets not divisible by the world size."""
    from helpers import run_cli

    odd = {"benchmark": {"init_args": {"test_fraction": 0.2505}}}  # 451 test samples per domain
    single = run(resolve_config(tiny_config(**odd)), None)
    cfg = tiny_config(**odd, trainer={"accelerator": "cpu", "devices": 2, "strategy": "ddp"},
                      train={"eval_batch_size": 100})
    proc = run_cli("run", "--config", str(write_yaml(cfg)), "--output", str(tmp_path / "ddp"), "--no-progress")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "ddp" / "result.json").read_text())
    assert result["r_init"] == single["r_init"]
    assert len(result["r_matrix"]) == 3
    assert proc.stdout.count("R matrix") == 1  # only rank 0 reports


def test_timm_vit_on_8x8_digits():
    cfg = resolve_config(tiny_config(model={"class_path": "vit",
                                            "init_args": {"embed_dim": 32, "depth": 1, "num_heads": 2}}))
    result = run(cfg, None)
    assert result["model"]["params_total"] > 0 and len(result["r_matrix"]) == 3


def test_reference_models_give_intransigence_and_reference_fwt():
    cfg = resolve_config(tiny_config(metrics={"reference_models": True}))
    result = run(cfg, None)
    reference = result["reference"]
    assert len(reference) == 3 and all(0.0 <= v <= 1.0 for v in reference)
    r = result["r_matrix"]
    # the first experience's reference starts from the same weights with the same data and
    # seeds as the continual run's first stage: it is the same training
    assert reference[0] == r[0][0]
    assert reference[1:] != [r[1][1], r[2][2]]  # later ones start from the untrained weights
    assert result["scores"]["im"] is not None and result["scores"]["fwt_ref"] is not None


def test_imbalanced_stream_reports_gmean_mauc_matrices_and_global_test_set():
    cfg = resolve_config(tiny_config(benchmark={"class_path": "digits-dirichlet", "init_args": {"num_experiences": 3}}))
    result = run(cfg, None)
    for name in ("gmean", "mauc"):
        matrix = result["matrices"][name]
        assert len(matrix) == 3 and all(len(row) == 3 for row in matrix)
        assert len(result["global_test"][name]) == 3
        assert result["scores"][f"global_{name}"] == result["global_test"][name][-1]
    assert 0.5 < result["scores"]["global_mauc"] <= 1.0
    # the final per-class recall is recorded, and its geometric mean over present classes is G-mean
    recall = result["recall_final"]
    assert len(recall["columns"]) == 3 and len(recall["global"]) == 10
    for values, gmean in [*zip(recall["columns"], result["matrices"]["gmean"][-1]),
                          (recall["global"], result["scores"]["global_gmean"])]:
        present = [v for v in values if v is not None]
        assert all(0.0 <= v <= 1.0 for v in present)
        expected = 0.0 if min(present) == 0 else math.exp(sum(math.log(v) for v in present) / len(present))
        assert gmean == pytest.approx(expected, abs=1e-3)


def test_moe_layers_report_per_domain_expert_utilization(tmp_path):
    """A model whose MoE layer records routing gets U[d, e] per stage in result.json."""
    plugin = tmp_path / "moe_model.py"
    plugin.write_text(textwrap.dedent('''
        import torch
        from torch import nn
        from clbench.models import routing_channel as routing

        class TopOneMoE(nn.Module):
            records_routing = True

            def __init__(self, dim, num_experts):
                super().__init__()
                self.num_experts = num_experts
                self.router = nn.Linear(dim, num_experts)
                self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(num_experts))

            def forward(self, x):
                gates = self.router(x).softmax(-1)
                top = gates.argmax(-1)
                routing.record(self, experts=top[:, None], gates=gates)
                out = torch.stack([e(x) for e in self.experts], 1)
                return out[torch.arange(len(x)), top] * gates.gather(1, top[:, None])

        def moe_mlp(num_classes, input_shape, num_experts: int = 3):
            return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), TopOneMoE(32, num_experts),
                                 nn.Linear(32, num_classes))
    '''))
    result = run(resolve_config(tiny_config(model={"class_path": f"{plugin}:moe_mlp"})), None)
    stages = result["expert_utilization"]
    assert len(stages) == 3
    u = stages[-1]["3"]["utilization"]  # the MoE layer is module "3" of the Sequential
    assert len(u) == 3 and all(len(row) == 3 for row in u)
    for row in u:  # each domain's units are all routed somewhere
        assert sum(row) == pytest.approx(1.0)


def test_undefined_scores_are_null_in_strict_json(tmp_path):
    """A one-class test partition has no MAUC: it is written as null, never as NaN."""
    cfg = resolve_config(tiny_config(benchmark={"class_path": "digits-dirichlet",
                                                "init_args": {"num_experiences": 5, "alpha": 0.01, "min_size": 5}}))
    result = run(cfg, tmp_path / "out")
    text = (tmp_path / "out" / "result.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text)  # strict parse
    flat = [v for row in result["matrices"]["mauc"] for v in row]
    assert None in flat  # alpha=0.01 leaves some partition with a single class
