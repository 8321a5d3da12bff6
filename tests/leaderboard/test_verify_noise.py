"""Which reruns verify holds to equality, and how it weighs a difference against the test set's noise."""

from __future__ import annotations

import math

from clbench.leaderboard.noise import largest_in_se, why_not_exact

HERE = {"cpu": {"model": "AMD EPYC", "isa": "AVX2", "pin": "avx2"}, "precision": "32-true", "cuda": None}


def _env(**changes) -> dict:
    cpu = {**HERE["cpu"], **changes.pop("cpu", {})}
    return {**HERE, "cpu": cpu, **changes}


def test_only_a_pinned_fp32_cpu_entry_at_its_level_must_be_exact_on_its_vendors_cpus():
    elsewhere = _env(cpu={"model": "Intel Xeon", "isa": "AVX512"})
    other_epyc = _env(cpu={"model": "AMD EPYC 9B14", "isa": "AVX512", "vendor": "AuthenticAMD"})
    assert why_not_exact(_env(), other_epyc, at_recorded_level=True) is None  # pinned: equal on any AMD AVX2 CPU
    # MKL's AVX2 branch is Intel's own: an AMD entry reruns on an Intel CPU under another MKL branch
    assert "pinned to avx2 on a CPU of another vendor (AuthenticAMD, rerun on GenuineIntel" \
        in why_not_exact(_env(), elsewhere, True)
    assert "another vendor (not recorded" in why_not_exact(_env(cpu={"model": "Elsewhere CPU"}), other_epyc, True)
    # the default level's MKL branch (COMPATIBLE) is the one MKL runs alike on every vendor's CPU
    assert why_not_exact(_env(cpu={"pin": "default", "isa": "DEFAULT"}), elsewhere, True) is None
    assert why_not_exact(_env(cpu={"pin": None}), _env(cpu={"pin": None}), True) is None  # unpinned, same CPU
    assert "unpinned kernels on another CPU" in why_not_exact(_env(cpu={"pin": None}), elsewhere, True)
    assert "bf16-mixed on another CPU" in why_not_exact(_env(precision="bf16-mixed"), elsewhere, True)
    assert why_not_exact(_env(precision="bf16-mixed"), _env(), True) is None  # the same CPU's bf16 units
    assert "which this CPU lacks" in why_not_exact(_env(cpu={"isa": "AVX512", "pin": "avx512"}), _env(), False)
    gpu = _env(cuda="12.8", device="NVIDIA H100")
    assert why_not_exact(gpu, gpu, False) is None
    assert "made on a GPU (NVIDIA H100)" in why_not_exact(gpu, _env(cuda="12.8", device="NVIDIA A100"), False)


def _entry(r, se, n=100, **more) -> dict:
    return {"r_matrix": r, "r_stderr": se, "r_n": [n] * len(r[0]), "r_metric": {"names": ["accuracy"]}, **more}


def test_a_difference_is_counted_in_its_cells_standard_error():
    committed = _entry([[0.50, 0.80]], [[0.05, 0.04]])
    assert largest_in_se(committed, {"r_matrix": [[0.52, 0.80]]}) == (0.40000000000000036, "R[0][0]")
    assert largest_in_se(committed, {"r_matrix": [[0.50, 0.60]]})[1] == "R[0][1]"
    assert math.isclose(largest_in_se(committed, {"r_matrix": [[0.50, 0.60]]})[0], 5.0)
    # scores and the untrained row have their SEs too
    scored = _entry([[0.5]], [[0.05]], scores={"acc": 0.5}, scores_stderr={"acc": 0.05},
                    r_init=[0.1], r_init_stderr=[0.03])
    assert largest_in_se(scored, {"r_matrix": [[0.5]], "scores": {"acc": 0.5}, "r_init": [0.16]})[1] == "r_init[0]"


def test_a_cell_at_0_or_100_percent_is_not_infinitely_precise():
    """The binomial SE of 100/100 is 0; one test sample's weight (1/n) floors it."""
    committed = _entry([[1.0]], [[0.0]], n=100)
    assert math.isclose(largest_in_se(committed, {"r_matrix": [[0.99]]})[0], 1.0)
    # an R that is no share of test samples (a squared error) gets no such floor
    regression = {**committed, "r_metric": {"names": ["mse"]}, "metrics": {"mse": {"percent": False}}}
    assert largest_in_se(regression, {"r_matrix": [[0.99]]}) == (math.inf, "R[0][0]")


def test_nothing_to_judge_by_is_never_within_noise():
    assert largest_in_se({"r_matrix": [[0.5]]}, {"r_matrix": [[0.52]]})[0] == math.inf
    assert largest_in_se(_entry([[0.5]], [[0.05]]), {"r_matrix": [[None]]})[0] == math.inf


def test_a_regression_entry_without_sample_counts_is_judged_not_crashed():
    """A regression board records no test-sample counts (``r_n`` of nulls): its scores take no
    one-sample floor, and a difference with no SE recorded is beyond any SE."""
    committed = {"r_matrix": [[3.1, 2.0]], "r_stderr": [[None, None]], "r_n": [None, None],
                 "r_metric": {"names": ["mse"]},
                 "metrics": {"mse": {"percent": False}}, "scores": {"acc": 3.1}, "scores_stderr": {"acc": 0.2}}
    rerun = {"r_matrix": [[3.1, 2.0]], "scores": {"acc": 3.2}}
    assert math.isclose(largest_in_se(committed, rerun)[0], 0.5) and largest_in_se(committed, rerun)[1] == "scores.acc"
    assert largest_in_se({**committed, "scores_stderr": {"acc": None}}, rerun) == (math.inf, "scores.acc")
