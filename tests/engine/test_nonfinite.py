"""NaN/Inf loss: the run stops with one line naming the experience; a suite records it and goes on."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from helpers import run_cli, tiny_config

POISON = textwrap.dedent('''
    from typing import Annotated

    from pydantic import AllowInfNan

    from clbench.strategy import Strategy


    class PoisonLoss(Strategy):
        """Plain fine-tuning whose loss value becomes ``factor`` x loss from experience ``at`` on.

        The gradient of the poisoned loss is zero, so the weights stay finite and the epoch's
        mean loss is exactly ``factor``'s kind of non-finite (nan or inf).
        """

        def __init__(self, at: int = 1, factor: Annotated[float, AllowInfNan(True)] = float("nan")):
            super().__init__()
            self.at = at
            self._factor = factor  # not a recorded hyper-parameter: result.json holds no nan (strict JSON)

        def training_loss(self, ctx, x, y, logits, loss):
            if ctx.experience < self.at:
                return loss
            return loss.detach() * self._factor + 0.0 * loss
''')


@pytest.fixture
def poison(tmp_path) -> Path:
    path = tmp_path / "poison.py"
    path.write_text(POISON)
    return path


def _one_error_line(proc) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("clbench: error: ")
    return lines[0]


def test_nan_loss_stops_the_run_naming_the_experience(tmp_path, poison, write_yaml):
    config = write_yaml(tiny_config(strategy={"class_path": f"{poison}:PoisonLoss", "init_args": {"at": 1}}))
    out = tmp_path / "out"
    line = _one_error_line(run_cli("run", "--config", str(config), "--output", str(out), "--no-progress"))
    assert f"{config}: training diverged on experience 2/3 'rot90': loss became nan in epoch 1/1" in line
    assert "lower train.optimizer.init_args.lr" in line
    assert not (out / "result.json").exists()
    # the first experience's checkpoint is kept, whole
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ckpt["state"]["stage"] == 1


def test_inf_loss_in_the_first_experience(tmp_path, poison, write_yaml):
    config = write_yaml(tiny_config(strategy={"class_path": f"{poison}:PoisonLoss",
                                              "init_args": {"at": 0, "factor": float("inf")}}))
    out = tmp_path / "out"
    line = _one_error_line(run_cli("run", "--config", str(config), "--output", str(out), "--no-progress"))
    assert "training diverged on experience 1/3 'rot0': loss became inf in epoch 1/1" in line
    assert not (out / "result.json").exists() and not (out / "checkpoint.pt").exists()


def test_a_huge_learning_rate_really_diverges(tmp_path, write_yaml):
    config = write_yaml(tiny_config(train={"optimizer": {"class_path": "sgd", "init_args": {"lr": 1.0e12}}}))
    out = tmp_path / "out"
    line = _one_error_line(run_cli("run", "--config", str(config), "--output", str(out), "--no-progress"))
    assert "training diverged on experience 1/3 'rot0'" in line
    assert not (out / "result.json").exists()


def test_a_suite_records_the_diverged_run_as_failed_and_goes_on(tmp_path, poison):
    from clbench.leaderboard.entries import load_entries
    from clbench.leaderboard.suite import load_suite

    base = tiny_config()
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "diverging",
        "benchmarks": [base["benchmark"]],
        "models": [base["model"]],
        "strategies": [{"class_path": f"{poison}:PoisonLoss", "init_args": {"at": 1}}, "naive"],
        "orders": ["default"],
        "seeds": [0],
        "base": {"train": base["train"], "logging": base["logging"]},
    }, sort_keys=False))
    board = tmp_path / "board"
    proc = run_cli("leaderboard", "run", "--no-render", "--suite", str(suite), "--output", str(board), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    hashes = [r.hash for r in load_suite(suite).runs]
    entries = {e.config_hash: e.document for e in load_entries(board)}  # every entry verifies
    assert sorted(entries) == sorted(hashes)
    failed, ok = entries[hashes[0]], entries[hashes[1]]
    assert failed["status"] == "failed"
    assert "training diverged on experience 2/3 'rot90': loss became nan" in failed["error"]
    assert ok["status"] == "ok" and len(ok["r_matrix"]) == 3
    # rerunning does nothing twice: the failed entry stays failed, nothing is rerun
    before = {p.name: p.read_bytes() for p in (board / "entries").iterdir()}
    again = run_cli("leaderboard", "run", "--no-render", "--suite", str(suite), "--output", str(board), "--no-progress")
    assert again.returncode == 0, again.stderr
    assert {p.name: p.read_bytes() for p in (board / "entries").iterdir()} == before
    assert json.loads((board / "suite.json").read_text())["name"] == "diverging"
