"""Test helpers (importable as ``helpers``: pytest puts tests/ on sys.path): tiny configs that run in a second or two on a laptop CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "suites" / "smoke.yaml"
# Lightning's advice for hand-built Trainers in the LM strategy tests (the runner silences it itself)
LIGHTNING_NOISE = ["ignore:You defined a `validation_step`",
                   "ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated",
                   "ignore:The '(train|val)_dataloader' does not have many workers"]


def smoke(**changes) -> dict:
    """The smoke suite as a dict, with top-level keys replaced."""
    import yaml

    data = yaml.safe_load(SMOKE.read_text())
    data.update(changes)
    return data


def write_suite(folder: Path, data: dict, name: str = "suite.yaml") -> Path:
    import yaml

    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tiny_config(**overrides) -> dict:
    """A raw config (before resolution) for a 3-domain digits stream, one epoch, a small MLP."""
    from clbench.config import deep_merge

    base = {
        "seed": 0,
        "benchmark": {"class_path": "digits-domains", "init_args": {"domains": ["rot0", "rot90", "rot180"]}},
        "model": {"class_path": "mlp", "init_args": {"hidden": 32}},
        "strategy": {"class_path": "naive"},
        "train": {"epochs": 1, "batch_size": 64, "optimizer": {"class_path": "adam", "init_args": {"lr": 0.01}}},
        "logging": {"progress": False, "tensorboard": False},
    }
    return deep_merge(base, overrides)


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 300):
    """``python -m clbench.cli ARGS`` in a subprocess; returns the CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "clbench.cli", *args], cwd=cwd or REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


class Crash(Exception):
    """Stands in for SIGKILL inside the test process."""


def crash_at(monkeypatch, point: str, cfg: dict, output: Path) -> None:
    """Run ``cfg`` into ``output`` and stop it dead at fault ``point`` (``clbench.faults`` syntax,
    e.g. ``stage:2:step:5``), leaving what a killed process leaves: its last checkpoint."""
    import pytest

    from clbench import faults
    from clbench.runner import run

    def die() -> None:
        raise Crash

    monkeypatch.setattr(faults, "die", die)
    monkeypatch.setenv(faults.ENV, point)
    with pytest.raises(Crash):
        run(cfg, output)
    monkeypatch.delenv(faults.ENV)
