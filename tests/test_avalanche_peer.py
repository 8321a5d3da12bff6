"""perf/avalanche_peer.py without training: the TOST verdict, the suite's settings, the --args overrides."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

PATH = Path(__file__).resolve().parents[1] / "perf" / "avalanche_peer.py"


@pytest.fixture(scope="module")
def peer():
    spec = importlib.util.spec_from_file_location("perf_avalanche_peer", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # perf/ is not a package
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def one_sided_max(d, margin):
    """The TOST p-value from scipy's own one-sample t-tests, computed independently of the script."""
    lower = stats.ttest_1samp(d, -margin, alternative="greater").pvalue  # H0: mean <= -margin
    upper = stats.ttest_1samp(d, margin, alternative="less").pvalue      # H0: mean >= +margin
    return max(lower, upper)


def test_tight_differences_around_zero_are_equivalent(peer):
    d = [0.1, -0.2, 0.15, -0.05, 0.0, 0.1, -0.1, 0.05]
    low, high, p, verdict = peer.tost(d, 2.0, 0.05)
    assert verdict == "equivalent within ±2"
    assert -2.0 < low < np.mean(d) < high < 2.0
    assert p < 1e-6


def test_a_mean_of_three_is_not_equivalent_within_two(peer):
    d = [2.8, 3.1, 3.0, 2.9, 3.2]
    low, high, p, verdict = peer.tost(d, 2.0, 0.05)
    assert verdict == "not established"
    assert 2.0 < low < 3.0 < high  # the 90% interval lies outside the margin altogether
    assert p > 0.99


def test_two_seeds_cannot_show_what_ten_seeds_do(peer):
    few = [-1.0, 1.0]
    many = [-1.0, 1.0] * 5  # the same mean and spread, five times the pairs
    low2, high2, p2, verdict2 = peer.tost(few, 2.0, 0.05)
    low10, high10, p10, verdict10 = peer.tost(many, 2.0, 0.05)
    assert verdict2 == "not established" and verdict10 == "equivalent within ±2"
    t1 = stats.t.ppf(0.95, 1)  # 6.31 at one degree of freedom: the interval is mean ± 6.31 · 1
    assert low2 == pytest.approx(-t1) and high2 == pytest.approx(t1)
    assert -2.0 < low10 and high10 < 2.0 and p10 < 0.05 < p2


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("margin", [0.5, 2.0])
def test_p_is_the_larger_one_sided_p_and_the_interval_is_the_90_percent_one(peer, seed, margin):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 12))
    d = rng.normal(rng.uniform(-3, 3), rng.uniform(0.2, 3), size=n)
    low, high, p, verdict = peer.tost(d.tolist(), margin, 0.05)
    assert p == pytest.approx(one_sided_max(d, margin), rel=1e-9, abs=1e-12)
    interval = stats.t.interval(0.90, n - 1, loc=d.mean(), scale=stats.sem(d))
    assert (low, high) == pytest.approx(interval, rel=1e-9)
    # both tests reject exactly when the 90% interval lies inside the margin
    assert (verdict == f"equivalent within ±{margin:g}") == (p < 0.05) == (-margin < low and high < margin)


def test_one_seed_and_identical_differences(peer):
    low, high, p, verdict = peer.tost([0.3], 2.0, 0.05)
    assert math.isnan(low) and math.isnan(high) and math.isnan(p) and verdict == "not established"
    assert peer.tost([0.5, 0.5, 0.5], 2.0, 0.05) == (0.5, 0.5, 0.0, "equivalent within ±2")
    assert peer.tost([2.5, 2.5], 2.0, 0.05)[2:] == (1.0, "not established")


def test_table_row(peer):
    row = peer.table_row("si", [0, 1, 2], [50.0, 51.0, 52.0], [50.1, 50.9, 52.2], 2.0)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:4] == ["si", "0, 1, 2", "51.0 ± 1.0", "51.1 ± 1.1"]
    assert cells[4].startswith("-0.1 [") and cells[6] == "equivalent within ±2"
    assert float(cells[5]) == pytest.approx(one_sided_max(np.array([-0.1, 0.1, -0.2]), 2.0), abs=5e-4)


SUITE = """
name: tiny
benchmarks:
  - class_path: fashion-mnist-split
    init_args: {train_per_class: 10}
    train_args: {epochs: 7}
    strategies:
      - {class_path: si, init_args: {c: 100.0}}
      - {class_path: si, init_args: {c: 1.0}}
      - class_path: derpp
        init_args: {mem_size: 50}
        train_args: {batch_size: 32}
        model_args: {hidden: 64}
  - class_path: fashion-mnist-split
    init_args: {scenario: task-il}
  - fashion-mnist-rotated
models:
  - class_path: mlp
    init_args: {hidden: 16, depth: 1}
strategies:
  - naive
  - {class_path: mas, init_args: {mas_lambda: 3.0}}
orders: [default]
seeds: [0]
base:
  train: {epochs: 2, batch_size: 8, optimizer: {class_path: adam, init_args: {lr: 0.01}}}
  logging: {tensorboard: false}
"""


def test_suite_settings_with_benchmark_strategies_and_train_args(peer, tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(SUITE)
    s = peer.suite_settings(path)
    assert list(s["benchmarks"]) == ["fashion-mnist-split", "fashion-mnist-rotated"]  # the first split wins
    split, rotated = s["benchmarks"]["fashion-mnist-split"], s["benchmarks"]["fashion-mnist-rotated"]
    assert split["init_args"] == {"train_per_class": 10} and rotated["init_args"] == {}
    lr = {"class_path": "adam", "init_args": {"lr": 0.01}}
    assert split["train"] == {"epochs": 7, "batch_size": 8, "optimizer": lr}   # train_args over base.train
    assert rotated["train"] == {"epochs": 2, "batch_size": 8, "optimizer": lr}
    assert list(split["strategies"]) == ["si", "derpp"]                      # its own list, not the suite's
    assert split["strategies"]["si"]["init_args"] == {"c": 100.0}           # the first of a name
    assert split["strategies"]["derpp"]["train"] == {"epochs": 7, "batch_size": 32, "optimizer": lr}
    assert split["strategies"]["derpp"]["model_args"] == {"hidden": 64}
    assert list(rotated["strategies"]) == ["naive", "mas"]                   # the suite's
    assert rotated["strategies"]["mas"]["init_args"] == {"mas_lambda": 3.0}
    assert s["model"] == {"class_path": "mlp", "init_args": {"hidden": 16, "depth": 1}}
    assert s["base"]["logging"] == {"tensorboard": False}


def test_method_settings_suite_defaults_and_overrides(peer, tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(SUITE)
    s = peer.suite_settings(path)
    derpp = peer.method_settings(s, "fashion-mnist-split", "derpp")
    assert derpp["source"] == "suite"
    assert derpp["init_args"] == {"mem_size": 50, "alpha": 1.0, "beta": 1.0, "replay_batch_size": None}
    assert derpp["train"]["batch_size"] == 32 and derpp["model"]["init_args"] == {"hidden": 64, "depth": 1}
    overrides = peer.parse_overrides(["mas:mas_lambda=10,samples=null", "er_ace:mem_size=300"])
    assert overrides == {"mas": {"mas_lambda": 10, "samples": None}, "er_ace": {"mem_size": 300}}
    er_ace = peer.method_settings(s, "fashion-mnist-split", "er_ace", overrides)  # not in the suite
    assert er_ace["source"] == "defaults + --args"
    assert er_ace["init_args"] == {"mem_size": 300, "replay_batch_size": None}
    assert er_ace["train"]["epochs"] == 7 and er_ace["model"]["init_args"] == {"hidden": 16, "depth": 1}
    mas = peer.method_settings(s, "fashion-mnist-rotated", "mas", overrides)
    assert mas["source"] == "suite + --args" and mas["init_args"]["mas_lambda"] == 10
    assert peer.method_settings(s, "fashion-mnist-rotated", "si")["init_args"] == {"c": 1.0, "xi": 0.1}


@pytest.mark.parametrize("bad", ["derpp", "derpp:alpha", ":alpha=1", "derpp:=1"])
def test_parse_overrides_refuses_malformed_items(peer, bad):
    with pytest.raises(ValueError, match="--args"):
        peer.parse_overrides([bad])


def test_default_suite_still_reads(peer):
    s = peer.suite_settings()
    split = s["benchmarks"]["fashion-mnist-split"]  # the class-IL item, listed before the task-IL one
    assert split["init_args"] == {} and split["train"]["epochs"] == 21 and split["train"]["batch_size"] == 128
    # the values the validation search chose for class-IL, not the strategies' defaults
    assert split["strategies"]["ewc"]["init_args"] == {"ewc_lambda": 1e6}
    assert split["strategies"]["derpp"]["init_args"] == {"mem_size": 1000, "alpha": 1.0, "beta": 1.0}
    assert set(peer.METHODS) == {"naive", "ewc", "replay", "lwf", "agem", "gem",
                                 "derpp", "er_ace", "icarl", "gdumb", "si", "mas"}


def test_mas_schedule_makes_avalanche_sum_the_importances(peer):
    from avalanche.training.plugins import MASPlugin

    mas = MASPlugin(lambda_reg=5.0, alpha=0.5)
    strategy = type("Stub", (), {"plugins": [mas]})()
    schedule = peer.mas_sum_schedule(5.0)
    seen = []
    for _ in range(4):
        schedule.before_training_exp(strategy)
        seen.append((mas.alpha, mas._lambda))
    assert seen == [(0.0, 0.0), (0.5, 5.0), (pytest.approx(2 / 3), 10.0), (0.75, 15.0)]
    # α_e Ω + (1 − α_e) Ω_e over e = 1..3 is the mean of Ω_0..Ω_e; times e·λ during e + 1: λ · the sum
    omegas, importance = [1.0, 4.0, 2.0, 8.0], 1.0
    for e in range(1, 4):
        importance = (e / (e + 1)) * importance + (1 - e / (e + 1)) * omegas[e]
        assert (e + 1) * 5.0 * importance == pytest.approx(5.0 * sum(omegas[:e + 1]))
