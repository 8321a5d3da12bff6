"""Every suite ships a single-run config (configs/examples/<suite>-<strategy>.yaml) that is one of
its cells, so nobody copies a run out of a suite file by hand; every example config is valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from clbench.plugins.build import preflight
from clbench.config.load import config_hash, load_config
from clbench.leaderboard.suite import load_suite

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "configs" / "examples").glob("*.yaml"))
SUITES = {load_suite(p).name: p for p in sorted((ROOT / "configs" / "suites").glob("*.yaml"))}
NO_EXAMPLE = {"smoke"}  # the tests' suite


def _strategy_names(suite_path: Path) -> set[str]:
    from clbench.config.yaml_files import load_yaml_text

    raw = load_yaml_text(suite_path.read_text())
    items = list(raw.get("strategies") or [])  # the suite's, and each benchmark's own
    items += [item for bench in raw["benchmarks"] if isinstance(bench, dict) for item in bench.get("strategies") or []]
    return {item if isinstance(item, str) else item["class_path"] for item in items}


@pytest.mark.parametrize("name", sorted(set(SUITES) - NO_EXAMPLE))
def test_every_suite_has_a_single_run_example_that_is_one_of_its_cells(name):
    examples = [p for p in EXAMPLES if p.stem in {f"{name}-{s}" for s in _strategy_names(SUITES[name])}]
    assert examples, f"no configs/examples/{name}-<strategy>.yaml for suite {name}"
    cells = {run.hash for run in load_suite(SUITES[name]).runs}
    for path in examples:
        assert config_hash(load_config(path)) in cells, f"{path.name} is not a cell of suite {name}"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_config_passes_the_preflight(path):
    preflight(load_config(path), str(path))
