"""Every shipped experiment config resolves and passes the pre-flight check, and its strategy
accepts its arguments: a config that only runs on a GPU cluster is still checked here."""

from pathlib import Path

import pytest

from clbench.plugins.build import build_strategy, preflight
from clbench.config.load import read_yaml, resolve_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_experiment_config_is_valid(path):
    cfg = resolve_config(read_yaml(path), source=str(path))
    preflight(cfg, str(path))
    build_strategy(cfg, str(path))  # the strategy's own checks of its arguments


def test_the_moe_methods_have_real_trace_configs():
    names = {p.stem for p in CONFIGS}
    assert {f"trace_qwen3_0.6b_{m}" for m in ("loramoe", "mh_moe", "moses")} <= names
