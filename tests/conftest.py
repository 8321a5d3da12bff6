"""Shared fixtures.

The tests mirror the package: ``tests/<name>/`` checks ``clbench/<name>/`` (config, plugins,
engine, data, models, objectives, metrics, results, leaderboard, cli), ``tests/strategies/`` and
``tests/benchmarks/`` the built-in methods and streams; the top level holds what concerns the
whole package (its public API, packaging, import graph, a newcomer's path, the notebook).
Helpers shared across folders live in ``helpers.py`` (tiny configs, the crash helper, fake
entries) and ``lm_helpers.py`` (a tiny causal LM and two text tasks); this folder is on
``sys.path`` because pytest puts the folder of this conftest there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Language-model runs keep fp32 on a CPU with bf16 units too (clbench.engine.precision), here and
# in every process a test starts: the suite's numbers must not depend on the machine it runs on.
# tests/engine/test_precision.py checks the bf16 default itself.
os.environ["CLBENCH_CPU_BF16"] = "0"
# Under pytest-xdist (the README's test command) every core already runs a worker: one torch
# thread per worker, and per process it starts, keeps the machine from being oversubscribed.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# Every test process computes at this CPU's native kernel level from the start, as a notebook that
# used torch does: a suite or verify called in this process then cannot pin it
# (clbench.cpu_kernels), so no test leaves a pin behind for the next. Pins are tested
# through fresh processes (tests/leaderboard/test_cpu_kernels.py).
for _name in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA"):
    os.environ.pop(_name, None)
import torch  # noqa: E402

torch.ones(2).exp().sum()


@pytest.fixture
def write_yaml(tmp_path):
    """Write a dict as YAML under tmp_path and return the path."""
    import yaml

    def write(data: dict, name: str = "config.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write


@pytest.fixture(scope="session")
def clean_smoke_board(tmp_path_factory) -> Path:
    """The smoke suite run once here from the checked-out code, as from a clean tree: entries
    whose reruns are bit-equal on this machine (committed entries rerun bit-equal only on the CPU
    class that made them). Shared: copy it before changing anything in it."""
    import contextlib
    import io

    from clbench.cli.main import main
    from helpers import SMOKE, as_clean_tree

    out = tmp_path_factory.mktemp("smoke") / "lb"
    with as_clean_tree(), contextlib.redirect_stdout(io.StringIO()):
        assert main(["leaderboard", "run", "--no-render", "--suite", str(SMOKE), "--output", str(out), "--no-progress"]) == 0
    return out
