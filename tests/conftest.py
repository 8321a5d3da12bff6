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

from pathlib import Path

import pytest


@pytest.fixture
def write_yaml(tmp_path):
    """Write a dict as YAML under tmp_path and return the path."""
    import yaml

    def write(data: dict, name: str = "config.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write
