"""Values read the way a person means them, and every value checked against its annotation.

Numbers follow YAML 1.2 (``lr: 1e-3`` is a float), every ``init_args`` value is checked against
its parameter's annotation by pydantic (containers, ``Literal``, ``Union``, constraints in the
signature), and a built-in component's bad setting is one line, exit 2, before any training.
Most cases run the CLI in this process (``clbench.cli.main.main``): a subprocess would prove nothing
more, and each case stays well under a second after the first import.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
import yaml

from clbench.cli.main import main
from clbench.config.yaml_files import load_yaml_text
from helpers import tiny_config, write_suite, smoke


def write(folder: Path, raw: dict, name: str = "cfg.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def refused(capsys, *argv: str) -> str:
    """Run ``clbench ARGV`` in process; require exit 2 and one line on stderr; return that line."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clbench: error: ") and "Traceback" not in err, err
    return lines[0].removeprefix("clbench: error: ")


def run_refused(capsys, tmp_path: Path, raw: dict, *overrides: str) -> str:
    """``clbench run`` of ``raw`` refused; nothing may be written into the output folder."""
    path = write(tmp_path, raw)
    line = refused(capsys, "run", "--config", str(path), "--output", str(tmp_path / "out"), "--no-progress",
                   *overrides)
    assert not (tmp_path / "out").exists()
    return line.replace(str(path), "cfg.yaml")


# -- YAML numbers ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, number", [
    ("1e-3", 1e-3), ("1E3", 1000.0), ("-2.5e-4", -2.5e-4), (".5", 0.5), ("-.5", -0.5), ("1e30", 1e30),
    ("1.0e-4", 1e-4), ("0.1", 0.1), (".inf", math.inf), ("+.Inf", math.inf), ("-.INF", -math.inf),
    ("-.inf", -math.inf), ("1.", 1.0)])
def test_yaml_reads_numbers_as_a_person_means_them(text, number):
    value = load_yaml_text(text)
    assert isinstance(value, float) and value == number
    assert load_yaml_text(f"{{lr: {text}}}") == {"lr": number}


@pytest.mark.parametrize("text", [".nan", ".NaN", ".NAN"])
def test_yaml_reads_nan_as_a_float(text):
    assert math.isnan(load_yaml_text(text))


@pytest.mark.parametrize("text, value", [("1", 1), ("0x1f", 31), ("true", True), ("null", None), ("info", "info"),
                                         ("1e", "1e"), ("e3", "e3"), ("1.2.3", "1.2.3"), ("nancy", "nancy")])
def test_yaml_other_scalars_are_unchanged(text, value):
    assert load_yaml_text(text) == value and type(load_yaml_text(text)) is type(value)


@pytest.mark.parametrize("text, value", [
    # YAML 1.2 core schema integers: decimal (leading zeros are decimal), 0o octal, 0x hex.
    ("017", 17), ("-017", -17), ("+5", 5), ("007", 7), ("0o17", 15), ("0x1F", 31),
    # YAML 1.1 integers the core schema reads as text: a typed field then refuses them by name.
    ("1:00", "1:00"), ("0b1000000", "0b1000000"), ("1_0", "1_0"), ("-0x1f", "-0x1f"), ("0O17", "0O17"),
    ("0o8", "0o8"), ("1_000.5", "1_000.5"),
    # YAML 1.1 booleans, bare inf/nan and dates are text too; null is null, ~ and empty only.
    ("yes", "yes"), ("Off", "Off"), ("inf", "inf"), ("-inf", "-inf"), ("nan", "nan"), ("2024-01-02", "2024-01-02"),
    ("~", None), ("", None), ("NULL", None), ("=", "=")])
def test_yaml_scalars_follow_the_yaml_1_2_core_schema(text, value):
    assert load_yaml_text(text) == value and type(load_yaml_text(text)) is type(value)
    assert load_yaml_text(f"k: {text}") == {"k": value}


def test_a_leading_zero_seed_is_decimal_in_files_and_overrides(tmp_path):
    from clbench.config.load import load_config

    path = write(tmp_path, tiny_config())
    path.write_text(path.read_text().replace("seed: 0", "seed: 017"))
    assert load_config(path)["seed"] == 17
    assert load_config(path, ["seed=017"])["seed"] == 17
    assert load_config(path, ["seed=0o17"])["seed"] == 15


@pytest.mark.parametrize("field, written, text", [
    ("train.epochs", "epochs: 1", "1:00"), ("train.batch_size", "batch_size: 64", "0b1000000"),
    ("seed", "seed: 0", "1_0")])
def test_yaml_1_1_integers_are_refused_by_name(tmp_path, capsys, field, written, text):
    """Sexagesimal, binary and underscored numbers are text under YAML 1.2, refused by the int field."""
    raw = tiny_config()
    assert run_refused(capsys, tmp_path, raw, f"{field}={text}").startswith(
        f"command line: {field}: expected int, got str '{text}'")
    path = write(tmp_path, raw)
    path.write_text(path.read_text().replace(written, f"{written.split(':')[0]}: {text}"))
    line = refused(capsys, "run", "--config", str(path), "--output", str(tmp_path / "out"), "--no-progress")
    assert line.startswith(f"{path}: {field}: expected int, got str '{text}'"), line


def _record_adam_rates(monkeypatch) -> list:
    import torch

    rates, original = [], torch.optim.Adam.__init__

    @functools.wraps(original)
    def init(self, params, *args, **kwargs):
        rates.append(kwargs.get("lr"))
        original(self, params, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "__init__", init)
    return rates


@pytest.mark.parametrize("where", ["file", "command line"])
def test_lr_1e_3_trains_with_0_001_and_is_recorded_as_a_number(tmp_path, capsys, monkeypatch, where):
    raw = tiny_config(benchmark={"init_args": {"domains": ["rot0", "rot90"]}})
    path = write(tmp_path, raw)
    if where == "file":
        path.write_text(path.read_text().replace("lr: 0.01", "lr: 1e-3"))
        overrides = []
    else:
        overrides = ["train.optimizer.init_args.lr=1e-3"]
    rates = _record_adam_rates(monkeypatch)
    code = main(["run", "--config", str(path), "--output", str(tmp_path / "out"), "--no-progress", *overrides])
    assert code == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    lr = result["config"]["train"]["optimizer"]["init_args"]["lr"]
    assert isinstance(lr, float) and lr == 0.001
    assert rates and all(rate == 0.001 for rate in rates[1:])  # the first is the trial build's


# -- init_args against their annotations ------------------------------------------------------

def _optimizer(lr) -> dict:
    return {"optimizer": {"class_path": "adam", "init_args": {"lr": lr}}}


@pytest.mark.parametrize("override, message", [
    ("train.optimizer.init_args.lr=true",
     "command line: train.optimizer.init_args.lr: expected float or Tensor, got bool True "
     "(give lr a value of type float | Tensor)"),
    ("train.optimizer.init_args.lr=abc",
     "command line: train.optimizer.init_args.lr: expected float or Tensor, got str 'abc' "
     "(give lr a value of type float | Tensor)"),
    ("train.optimizer.init_args.lr=.nan",
     "command line: train.optimizer.init_args.lr: lr must be a finite number, got nan "
     "(give lr a value of type float | Tensor)"),
    ("train.optimizer.init_args.betas=[0.9, x]",
     "command line: train.optimizer.init_args.betas[1]: expected float or Tensor, got str 'x'"),
    ("strategy.init_args.ewc_lambda=false",
     "command line: strategy.init_args.ewc_lambda: expected float, got bool False"),
])
def test_bad_value_on_the_command_line_is_one_line(tmp_path, capsys, override, message):
    raw = tiny_config(strategy={"class_path": "ewc"})
    assert run_refused(capsys, tmp_path, raw, override).startswith(message)


@pytest.mark.parametrize("changes, message", [
    ({"train": _optimizer(".inf")}, "cfg.yaml: train.optimizer.init_args.lr: lr must be a finite number, got inf"),
    ({"train": _optimizer("1e30x")}, "cfg.yaml: train.optimizer.init_args.lr: expected float or Tensor, got str"),
    ({"strategy": {"class_path": "seq_lora", "init_args": {"layers": ["x", 2.5]}}},
     "cfg.yaml: strategy.init_args.layers[0]: expected int, got str 'x' (give layers a value of type list[int >= 0] | null)"),
    ({"strategy": {"class_path": "seq_lora", "init_args": {"layers": [1, 2.5]}}},
     "cfg.yaml: strategy.init_args.layers[1]: expected int, got float 2.5"),
    ({"strategy": {"class_path": "replay", "init_args": {"policy": "fifo"}}},
     "cfg.yaml: strategy.init_args.policy: expected one of 'reservoir', 'class_balanced', got str 'fifo'"),
    ({"strategy": {"class_path": "ewc", "init_args": {"ewc_lambda": "1e3x"}}},
     "cfg.yaml: strategy.init_args.ewc_lambda: expected float, got str '1e3x'"),
    ({"pretrain": {"fraction": ".nan"}}, "cfg.yaml: pretrain.fraction: must be a finite number, got nan"),
    ({"train": {"scheduler": {"class_path": "cosine", "init_args": {"warmup_ratio": 1.5}}}},
     "cfg.yaml: train.scheduler.init_args.warmup_ratio: warmup_ratio must be <= 1, got 1.5 "
     "(give warmup_ratio a value of type float in [0, 1])"),
    ({"train": {"scheduler": {"class_path": "linear", "init_args": {"warmup_steps": -3}}}},
     "cfg.yaml: train.scheduler.init_args.warmup_steps: warmup_steps must be >= 0, got -3"),
    ({"benchmark": {"class_path": "trace-mini", "init_args": {"scoring": "lenient"}}},
     "cfg.yaml: benchmark.init_args.scoring: expected one of 'trace', 'normalized', got str 'lenient' "
     "(set scoring to one of 'trace', 'normalized')"),
])
def test_bad_value_in_the_file_is_one_line(tmp_path, capsys, changes, message):
    raw = tiny_config(**changes)
    path = write(tmp_path, raw)
    # write numbers as a person would (yaml.safe_dump quotes '.inf' as a string)
    path.write_text(path.read_text().replace("'.inf'", ".inf").replace("'.nan'", ".nan"))
    line = refused(capsys, "run", "--config", str(path), "--output", str(tmp_path / "out"))
    assert line.replace(str(path), "cfg.yaml").startswith(message), line
    assert not (tmp_path / "out").exists()


PLUGIN = '''\
from clbench.strategy import Strategy


class Weighted(Strategy):
    def __init__(self, weights: dict[str, int] | None = None, sizes: tuple[int, int] = (1, 2)):
        super().__init__()
        self.weights, self.sizes = weights, sizes
'''


@pytest.mark.parametrize("init_args, message", [
    ({"weights": {1: "x"}}, "strategy.init_args.weights[1]: expected str as a key, got int 1"),
    ({"weights": {"a": "x"}}, "strategy.init_args.weights.a: expected int, got str 'x'"),
    ({"sizes": [1, 2, 3]}, "strategy.init_args.sizes: sizes takes at most 2 item(s), got [1, 2, 3]"),
])
def test_containers_are_checked_item_by_item(tmp_path, capsys, init_args, message):
    (tmp_path / "weighted.py").write_text(PLUGIN)
    raw = tiny_config(strategy={"class_path": f"{tmp_path / 'weighted.py'}:Weighted", "init_args": init_args})
    assert message in run_refused(capsys, tmp_path, raw)


def test_a_list_is_accepted_for_a_tuple_and_an_int_for_a_float(tmp_path):
    from clbench.plugins.build import preflight
    from clbench.config.load import resolve_config

    (tmp_path / "weighted.py").write_text(PLUGIN)
    cfg = resolve_config(tiny_config(
        strategy={"class_path": f"{tmp_path / 'weighted.py'}:Weighted",
                  "init_args": {"weights": {"a": 1}, "sizes": [3, 4]}},
        train={"optimizer": {"class_path": "adam", "init_args": {"lr": 1, "betas": [0.9, 0.99]}}}), source="cfg.yaml")
    preflight(cfg, "cfg.yaml")


# -- a suite's orders are checked as a run's order ----------------------------------------------

def test_suite_refuses_a_negative_permutation_at_its_own_field(tmp_path, capsys):
    path = write_suite(tmp_path, smoke(orders=["default", {"permutation": -1}]))
    line = refused(capsys, "leaderboard", "run", "--no-render", "--suite", str(path), "--output", str(tmp_path / "board"))
    assert line == (f"{path}: orders[1]: a permutation's seed must be >= 0, got -1 "
                    "(give a seed such as {permutation: 3})")
    assert not (tmp_path / "board").exists()


# -- what the machine cannot do: one line naming the field --------------------------------------

@pytest.mark.parametrize("override, message", [
    ("train.batch_size=99999999999999999999",
     "command line: train.batch_size: must be <= 2147483647, got 99999999999999999999 "
     "(give train.batch_size a value of type int in [1, 2147483647])"),
    ("train.eval_batch_size=9223372036854775808", "command line: train.eval_batch_size: must be <= 2147483647"),
    ("train.num_workers=100000", "command line: train.num_workers: 100000 data-loader worker processes, but this "
                                 "process may use {cpus} CPUs (at most 4 workers each) (set train.num_workers "
                                 "between 0 and 12)"),
    ("--threads=100000", "--threads: 100000 torch threads, but this process may use {cpus} CPUs "
                         "(set --threads to a whole number from 1 to {cpus})")])
def test_a_setting_beyond_the_machine_is_one_line(tmp_path, capsys, monkeypatch, override, message):
    """A loader forking 100000 workers, 100000 torch threads, a batch beyond sys.maxsize (a ValueError
    traceback from islice): refused before anything is built, against the CPUs this process may use."""
    from clbench import limits

    monkeypatch.setattr(limits.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    line = run_refused(capsys, tmp_path, tiny_config(), override)
    assert line.startswith(message.format(cpus=3)), line


def test_a_trainer_refusal_names_the_argument_lightning_quotes(tmp_path, capsys):
    """``devices=0`` was blamed on trainer.accelerator (the message says "using cpu accelerator")."""
    line = run_refused(capsys, tmp_path, tiny_config(trainer={"accelerator": "cpu", "devices": 1}), "trainer.devices=0")
    assert line.startswith("command line: trainer.devices: Lightning refuses the Trainer settings: "
                           "`Trainer(devices=0)`"), line
    assert line.endswith("(change or remove that trainer argument; see lightning.pytorch.Trainer)"), line
    assert line.count("(") == line.count(")")


def test_threads_up_to_the_cpus_and_a_few_workers_per_cpu_are_accepted(monkeypatch):
    """A config written for a cluster node (8 workers) still runs on a 2-core machine; 9 do not."""
    from clbench import limits

    monkeypatch.setattr(limits.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    limits.check_workers(8, where="cfg.yaml: train.num_workers")
    assert limits.check_threads(2, where="--threads") == 2
    with pytest.raises(limits.UserError, match="cfg.yaml: train.num_workers: 9 data-loader worker processes"):
        limits.check_workers(9, where="cfg.yaml: train.num_workers")
    with pytest.raises(limits.UserError, match="--threads: 3 torch threads"):
        limits.check_threads(3, where="--threads")


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("where", ["file", "override value", "override key"])
def test_a_config_nested_5000_deep_is_one_line(tmp_path, capsys, where):
    """PyYAML's composer recurses once per level: a RecursionError traceback, before."""
    raw = tiny_config()
    if where == "file":
        path = write(tmp_path, raw)
        path.write_text(path.read_text() + f"objective: {{class_path: classification, init_args: {{x: {_nested(5000)}}}}}\n")
        line = refused(capsys, "run", "--config", str(path), "--output", str(tmp_path / "out"), "--no-progress")
        assert line == (f"{path}: objective.init_args.x[0][0][0]...: nested more than 64 levels deep (line "
                        f"{len(path.read_text().splitlines())}) (a config needs a few levels of mappings and lists: "
                        "flatten the value)"), line
    elif where == "override value":
        line = run_refused(capsys, tmp_path, raw, f"strategy.init_args={{x: {_nested(5000)}}}")
        assert line.startswith("command line: strategy.init_args.x[0][0][0]...: nested more than 64 levels deep "
                               "(a config needs"), line
    else:
        line = run_refused(capsys, tmp_path, raw, "strategy.init_args." + ".".join(["a"] * 5000) + "=1")
        assert line.startswith("command line: strategy.init_args.a.a.a.a...: nested more than 64 levels"), line
    assert not (tmp_path / "out").exists()


def test_a_mapping_nested_5000_deep_is_refused_without_recursion():
    from clbench.config.load import resolve_config
    from clbench.errors import UserError

    deep: dict = {}
    inner = deep
    for _ in range(5000):
        inner["a"] = {}
        inner = inner["a"]
    with pytest.raises(UserError, match=r"^config: strategy.init_args.a.a.a.a...: nested more than 64 levels"):
        resolve_config({**tiny_config(), "strategy": {"class_path": "naive", "init_args": deep}}, source="config")
    shallow = load_yaml_text(f"x: {_nested(60)}")  # deep enough for any real config
    assert isinstance(shallow["x"], list)


def test_a_suite_asking_more_threads_or_workers_than_cpus_is_refused_before_any_cell(tmp_path, capsys, monkeypatch):
    from clbench import limits

    monkeypatch.setattr(limits.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    path = write_suite(tmp_path, smoke(threads=100000))
    line = refused(capsys, "leaderboard", "run", "--no-render", "--suite", str(path), "--output", str(tmp_path / "board"))
    assert line == (f"{path}: threads: 100000 torch threads, but this process may use 2 CPUs "
                    "(set threads to a whole number from 1 to 2)")
    data = smoke()
    data["base"]["train"]["num_workers"] = 100000
    path = write_suite(tmp_path, data)
    line = refused(capsys, "leaderboard", "run", "--no-render", "--suite", str(path), "--output", str(tmp_path / "board"))
    assert line.startswith(f"{path}: base.train.num_workers: 100000 data-loader worker processes"), line
    assert not (tmp_path / "board").exists()


# -- built-in components' bad settings: one line, before any training -----------------------------

VIT = {"class_path": "vit_moe", "init_args": {"patch_size": 4, "embed_dim": 16, "depth": 4, "num_heads": 2,
                                               "mlp_ratio": 1.0}}


def _vit(**init_args) -> dict:
    return {**VIT, "init_args": {**VIT["init_args"], **init_args}}


MOE_THEORY = {"benchmark": {"class_path": "moe-regression", "init_args": {"rounds": 4}},
              "model": {"class_path": "clbench.strategies.moe_theory:moe_theory_model", "init_args": {"num_experts": 3}},
              "strategy": {"class_path": "moe_theory"}, "train": {"batch_size": 64}}


@pytest.mark.parametrize("changes, message", [
    ({"model": _vit(num_experts=0)},
     "cfg.yaml: model.init_args.num_experts: an MoE layer needs at least one expert"),
    ({"model": _vit(num_experts=4, top_k=5)},
     "cfg.yaml: model.init_args.top_k: top_k = 5 is more than num_experts = 4 (choose top_k between 1 and 4)"),
    ({"model": _vit(moe_blocks=[7])},
     "cfg.yaml: model.init_args.moe_blocks: block(s) [7] do not exist: this ViT has 4 blocks"),
    ({"model": _vit(moe_blocks=[])},
     "cfg.yaml: model.init_args.moe_blocks: no block is an MoE block, so this is the dense ViT"),
    ({"model": _vit(router="topk")},
     "cfg.yaml: model.init_args.router: expected one of 'switch', 'ema_centroid', 'prototype', got str 'topk'"),
    ({"model": _vit(top_k=0)}, "cfg.yaml: model.init_args.top_k: top_k must be >= 1, got 0"),
    ({"model": _vit(router_args={"gate": "hard"})},
     "cfg.yaml: model.init_args.router_args.gate: expected one of 'straight_through', 'normalized', 'raw', "
     "got str 'hard'"),
    ({"model": _vit(router_args={"alpha": 0.3})},
     "cfg.yaml: model.init_args.router_args.alpha: router 'switch' has no option 'alpha' (did you mean "),
    ({"model": _vit(router_args={"lr_mult": -1.0})},
     "cfg.yaml: model.init_args.router_args.lr_mult: router_args.lr_mult must be > 0, got -1.0"),
    ({**MOE_THEORY, "model": {**MOE_THEORY["model"], "init_args": {"num_experts": 0}}},
     "cfg.yaml: model.init_args.num_experts: num_experts must be >= 1, got 0"),
    ({**MOE_THEORY, "benchmark": {"class_path": "moe-regression", "init_args": {"sigma0": -1}}},
     "cfg.yaml: benchmark.init_args.sigma0: sigma0 must be > 0, got -1"),
    ({**MOE_THEORY, "strategy": {"class_path": "moe_theory", "init_args": {"eta": -0.5}}},
     "cfg.yaml: strategy.init_args.eta: eta must be > 0, got -0.5"),
    ({**MOE_THEORY, "strategy": {"class_path": "moe_theory", "init_args": {"eta": 0}}},
     "cfg.yaml: strategy.init_args.eta: eta must be > 0, got 0"),
    ({"benchmark": {"class_path": "digits-dirichlet", "init_args": {"num_experiences": 0}}},
     "cfg.yaml: benchmark.init_args.num_experiences: num_experiences must be >= 1, got 0 "
     "(give num_experiences a value of type int >= 1)"),
    ({"benchmark": {"class_path": "digits-domains", "init_args": {"domains": ["rot0", "rot90", "rot0"]}}},
     "cfg.yaml: benchmark.init_args.domains: domains must list each item once, got ['rot0', 'rot90', 'rot0']"),
    ({"objective": {"class_path": "classification", "init_args": {"class_weights": {"capp": 3}}}},
     "cfg.yaml: objective.init_args.class_weights.capp: unknown key 'capp' (set class_weights to mapping of alpha, "
     "cap | 'auto' | bool | null)"),
    ({"benchmark": {"class_path": "core50", "init_args": {"root": "nowhere", "augment": {"hue": 0.7}}}},
     "cfg.yaml: benchmark.init_args.augment.hue: augment.hue must be <= 0.5, got 0.7 (give augment a value of type "
     "bool | mapping of crop_scale, flip, color_jitter, hue, blur, noise)"),
    ({**MOE_THEORY, "benchmark": {"class_path": "moe-regression", "init_args": {"dim": 4, "samples": 6}}},
     "cfg.yaml: benchmark.init_args.samples: need 1 <= samples < dim (overparameterised), got samples=6, dim=4 "
     "(use e.g. dim: 10, samples: 6)"),
    ({"benchmark": {"class_path": "dirichlet", "init_args": {
        "source": {"class_path": "digits-dirichlet", "init_args": {"num_experiences": 5000}}}}},
     "cfg.yaml: benchmark.init_args.source.init_args.num_experiences: 5000 experiences cannot be cut from 1347 "
     "training samples (set num_experiences <= 1347)"),
])
def test_bad_setting_of_a_built_in_component_is_one_line(tmp_path, capsys, changes, message):
    assert run_refused(capsys, tmp_path, tiny_config(**changes)).startswith(message)


def _count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_a_shallow_vit_moe_still_has_an_moe_block_and_its_experts_count():
    from clbench.models.vision.moe import MoEMLP
    from clbench.models.vision.vit_moe import default_moe_blocks, vit_moe

    assert default_moe_blocks(12) == [8, 9, 10, 11] and default_moe_blocks(6) == [4, 5]
    assert default_moe_blocks(2) == [1] and default_moe_blocks(1) == [0]
    tiny = {**VIT["init_args"], "depth": 2}
    two, eight = vit_moe(10, (1, 8, 8), num_experts=2, **tiny), vit_moe(10, (1, 8, 8), num_experts=8, **tiny)
    assert [type(b.mlp) for b in two.blocks][-1] is MoEMLP and two.moe_blocks == [1]
    assert _count(eight) > _count(two)
    assert not any(isinstance(b.mlp, MoEMLP) for b in vit_moe(10, (1, 8, 8), label="ViT", **tiny).blocks)


def test_truncated_vit_weights_are_one_line(tmp_path, capsys):
    from safetensors.torch import save_file

    from clbench.models.vision.vit_moe import vit_moe

    dense = vit_moe(10, (1, 8, 8), label="ViT", **VIT["init_args"])
    path = tmp_path / "dense.safetensors"
    save_file({k: v.contiguous() for k, v in dense.state_dict().items()}, str(path))
    path.write_bytes(path.read_bytes()[:1000])
    line = run_refused(capsys, tmp_path, tiny_config(model=_vit(weights_path=str(path))))
    assert line.startswith(f"cfg.yaml: model.init_args.weights_path: cannot load {path}: ")


def test_truncated_pretrained_language_model_is_one_line(tmp_path):
    from clbench.plugins.build import call_plugin
    from clbench.errors import UserError
    from clbench.models.lm.fixtures import sample_texts, write_tiny_model
    from clbench.models.lm.causal_lm import hf_causal_lm
    from clbench.data.tokenizer import train_tiny_tokenizer

    tokenizer = train_tiny_tokenizer(sample_texts(50), tmp_path / "tok", vocab_size=300)
    folder = tmp_path / "model"
    write_tiny_model(folder, tokenizer, layers=1, hidden=32, heads=2)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(UserError) as info:
        call_plugin(hf_causal_lm, {"path": str(folder)}, "cfg.yaml: model.init_args", "cfg.yaml")
    assert info.value.one_line().startswith(f"cfg.yaml: model.init_args.path: cannot load from {folder}: ")


NOT_A_STREAM = '''\
def listing(n: int = 3):
    return list(range(n))


def empty():
    from clbench.data.streams import StreamSpec, build_scenario

    return build_scenario(StreamSpec(name="empty"), [], [], [])
'''


@pytest.mark.parametrize("factory, message", [
    ("listing", "returned a list, not a stream with train_stream and test_stream"),
    ("empty", "returned a stream without experiences"),
])
def test_benchmark_that_returns_no_stream_is_one_line(tmp_path, capsys, factory, message):
    (tmp_path / "bench.py").write_text(NOT_A_STREAM)
    name = f"{tmp_path / 'bench.py'}:{factory}"
    line = run_refused(capsys, tmp_path, tiny_config(benchmark={"class_path": name, "init_args": {}}))
    assert line.startswith(f"cfg.yaml: benchmark.class_path: benchmark '{name}' {message}")


def test_vit_moe_names_match_its_labels_and_routers():
    import typing

    from clbench.models.vision.routers import ROUTERS
    from clbench.models.vision.vit_moe import LABELS, Label, RouterName

    assert set(typing.get_args(Label)) == set(LABELS)
    assert set(typing.get_args(RouterName)) == {*ROUTERS, "prototype"}


def test_router_args_declare_every_routers_options():
    import typing

    from clbench.models.vision.vit_moe import RouterArgs, RouterName, router_options

    options = {name: router_options(name) for name in typing.get_args(RouterName)}
    assert set(RouterArgs.__annotations__) == set().union(*options.values())
    assert "lr_mult" in options["switch"] and "lr_mult" not in options["ema_centroid"]
    assert options["prototype"] == {"alpha", "std_weight", "metric", "temperature", "freeze_trunk"}


def test_constraints_in_signatures_are_shown_as_ranges_by_clbench_show(capsys):
    assert main(["show", "moe_theory"]) == 0
    out = capsys.readouterr().out
    assert "eta: float > 0 (default 0.5)" in out and "explore: int >= 0 | None" in out
    assert main(["show", "vit_moe"]) == 0
    out = capsys.readouterr().out
    assert "drop_path_rate: float in [0, 1)" in out and "top_k: int >= 1 | None" in out
    assert "router: Literal['switch', 'ema_centroid', 'prototype'] | None" in out


UNANNOTATED_OPTIMIZER = '''\
import torch


class Plain(torch.optim.SGD):
    def __init__(self, params, lr=0.1):
        if lr < 0:
            raise ValueError("negative rate")
        super().__init__(params, lr=lr)
'''


def test_optimizer_trial_build_reports_a_type_error_instead_of_swallowing_it(tmp_path):
    """Without annotations only the optimizer itself can refuse a value; its TypeError is one line too."""
    from clbench.plugins.build import optimizer_factory
    from clbench.config.load import resolve_config
    from clbench.errors import UserError

    (tmp_path / "plain_opt.py").write_text(UNANNOTATED_OPTIMIZER)
    cfg = resolve_config(tiny_config(train={"optimizer": {"class_path": f"{tmp_path / 'plain_opt.py'}:Plain",
                                                          "init_args": {"lr": "fast"}}}), source="cfg.yaml")
    with pytest.raises(UserError, match=r"^cfg.yaml: train.optimizer.init_args: the optimizer refuses its "
                                        r"arguments: '<' not supported"):
        optimizer_factory(cfg, "cfg.yaml")


def test_the_example_plugin_declares_its_range(tmp_path, capsys):
    from helpers import REPO

    raw = tiny_config(strategy={"class_path": f"{REPO / 'examples' / 'my_strategy.py'}:L2Anchor",
                                "init_args": {"strength": -1}})
    assert run_refused(capsys, tmp_path, raw).startswith(
        "cfg.yaml: strategy.init_args.strength: strength must be >= 0, got -1 (give strength a value of type float >= 0)")


def test_strategy_literals_match_the_names_their_code_knows():
    import inspect
    import typing

    from clbench.models.layers.moe_lora import TOP1_GATES
    from clbench.strategies.moe_lora import LoRAMoE
    from clbench.strategies.moses import INFERENCE, MoSEs

    def choices(cls, name):
        return set(typing.get_args(typing.get_type_hints(cls.__init__)[name]))

    assert choices(LoRAMoE, "top1_gate") == set(TOP1_GATES)
    assert choices(MoSEs, "task_inference") == set(INFERENCE)
    assert "raise UserError" not in inspect.getsource(LoRAMoE.__init__).split("checks = [")[0]


@pytest.mark.parametrize("strategy, init_args, message", [
    ("replay", {"mem_size": -5}, "strategy.init_args.mem_size: mem_size must be >= 0, got -5"),
    ("ewc", {"gamma": 1.5}, "strategy.init_args.gamma: gamma must be <= 1, got 1.5 (give gamma a value of type float in [0, 1])"),
    ("lwf", {"temperature": 0}, "strategy.init_args.temperature: temperature must be > 0, got 0"),
    ("agem", {"sample_size": 0}, "strategy.init_args.sample_size: sample_size must be >= 1, got 0"),
    ("grow", {"k": 1}, "strategy.init_args.k: k must be >= 2, got 1"),
    ("grow", {"layers": []}, "strategy.init_args.layers: layers needs at least 1 item(s), got [] "
                             "(set layers to 'all' | list[int | str])"),
    ("grow", {"layers": "some"}, "strategy.init_args.layers: expected one of 'all' or list, got str 'some'"),
    ("seq_lora", {"dropout": 1.0}, "strategy.init_args.dropout: dropout must be < 1, got 1.0"),
    ("moses", {"density": 0}, "strategy.init_args.density: density must be > 0, got 0"),
])
def test_strategy_ranges_come_from_their_signatures(tmp_path, capsys, strategy, init_args, message):
    raw = tiny_config(strategy={"class_path": strategy, "init_args": init_args})
    assert run_refused(capsys, tmp_path, raw).startswith(f"cfg.yaml: {message}")
