"""clbench.limits: one rule decides a run's torch threads, whether ``clbench run``, ``clbench.run``
or a suite starts it, and torch's setting is put back after."""

import io
import json

import pytest
import torch
import yaml
from helpers import process_state_kept, tiny_config

from clbench import limits
from clbench.errors import UserError
from clbench.limits import auto_threads, decide_threads, torch_threads


@pytest.mark.parametrize("cores, trainer, expected", [
    (1, {}, 1), (2, {"accelerator": "cpu", "devices": 1}, 1), (3, {}, 1),
    (4, {}, 4), (16, {"devices": 1}, 16), (16, {"devices": 4, "strategy": "ddp"}, 4),
    (16, {"devices": [0, 1]}, 8), (16, {"devices": "auto"}, 16), (6, {"devices": 8}, 1), (8, None, 8),
])
def test_auto_threads(cores, trainer, expected):
    assert auto_threads(trainer, cores=cores) == expected


@pytest.mark.parametrize("request_", ["auto", None])
@pytest.mark.parametrize("cores, trainer, expected", [(2, {}, 1), (8, {}, 8), (8, {"devices": 2}, 4)])
def test_auto_and_unset_follow_the_cores(monkeypatch, request_, cores, trainer, expected):
    monkeypatch.setattr(limits, "usable_cores", lambda: cores)
    assert decide_threads(request_, trainer, where="--threads") == expected


def test_a_number_is_used_as_given_whatever_the_trainer(monkeypatch):
    monkeypatch.setattr(limits, "usable_cpus", lambda: 4)
    monkeypatch.setattr(limits, "usable_cores", lambda: 4)
    assert decide_threads(3, {"devices": 2}, where="--threads") == 3
    assert decide_threads(4, None, where="--threads") == 4


@pytest.mark.parametrize("value, message", [
    (0, "must be >= 1, got 0"), (-2, "must be >= 1, got -2"), (5, "5 torch threads, but this process may use 4 CPUs"),
    (True, "expected int, got bool True"), ("2", "expected int, got str '2'"), (1.5, "expected int, got float 1.5"),
])
def test_numbers_outside_the_cpus_are_one_line_errors_naming_the_setting(monkeypatch, value, message):
    monkeypatch.setattr(limits, "usable_cpus", lambda: 4)
    with pytest.raises(UserError) as info:
        decide_threads(value, {}, where="suite.yaml: threads")
    line = info.value.one_line()
    assert line.startswith("suite.yaml: threads: ") and message in line
    assert "set threads to a whole number from 1 to 4" in line


def test_torch_threads_are_put_back_even_when_the_block_raises():
    before = torch.get_num_threads()
    target = 2 if before != 2 else 1
    with pytest.raises(RuntimeError):
        with torch_threads(target):
            assert torch.get_num_threads() == target
            raise RuntimeError("stop")
    assert torch.get_num_threads() == before
    with torch_threads(None):  # unset: left as it is
        assert torch.get_num_threads() == before


def test_cli_api_and_suite_run_one_config_alike(tmp_path, monkeypatch):
    """The same config through ``clbench run``, ``clbench.run`` and a one-point suite (none of them
    given a thread count): one decision, the same recorded threads, bit-identical R."""
    import clbench
    from rich.console import Console

    from clbench.cli.main import main
    from clbench.leaderboard.entries import entry_path
    from clbench.leaderboard.execute import run_suite
    from clbench.leaderboard.suite import load_suite

    raw = tiny_config(benchmark={"init_args": {"domains": ["rot0", "rot90"]}}, save={"final": False})
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "agree", "benchmarks": [raw["benchmark"]], "models": [raw["model"]],
        "strategies": [raw["strategy"]], "orders": ["default"], "seeds": [0],
        "base": {key: raw[key] for key in ("train", "logging", "save")}}, sort_keys=False))
    # 2 cores: auto is 1 thread; torch is left at 2, which a caller that did not decide would keep.
    monkeypatch.setattr(limits, "usable_cores", lambda: 2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with process_state_kept():
            assert main(["run", "--config", str(config), "--output", str(tmp_path / "cli"), "--no-progress"]) == 0
        from_cli = json.loads((tmp_path / "cli" / "result.json").read_text())
        from_api = clbench.run(str(config), tmp_path / "api").record
        assert torch.get_num_threads() == 2  # each put torch's setting back
        run_suite(load_suite(suite), tmp_path / "board", progress=False, console=Console(file=io.StringIO()))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    entry = json.loads(entry_path(tmp_path / "board", from_cli["config_hash"]).read_text())
    assert from_api["config_hash"] == entry["config_hash"] == from_cli["config_hash"]
    assert from_cli["env"]["torch_threads"] == from_api["env"]["torch_threads"] == entry["env"]["torch_threads"] == 1
    assert entry["execution"]["torch_threads"] == 1
    assert from_cli["r_matrix"] == from_api["r_matrix"] == entry["r_matrix"]
    assert from_cli["r_init"] == from_api["r_init"] == entry["r_init"]
