"""A suite's preflight checks every grid point as ``clbench run`` checks a config, with the model
arguments the harness supplies taken from the one place that lists them."""

import pytest
from helpers import smoke, write_suite

from clbench.errors import UserError
from clbench.leaderboard.suite import load_suite, preflight


def test_a_regression_models_output_dim_is_the_harnesss(tmp_path):
    """moe-regression's objective supplies input_shape and output_dim: a suite may set neither."""
    model = {"class_path": "clbench.strategies.moe_theory:moe_theory_model", "init_args": {"output_dim": 2}}
    data = smoke(benchmarks=[{"class_path": "moe-regression", "init_args": {"rounds": 2}}], models=[model],
                 strategies=["moe_theory"], orders=["default"])
    path = write_suite(tmp_path, data)
    with pytest.raises(UserError) as info:
        preflight(load_suite(path))
    line = info.value.one_line()
    assert line.startswith(f"{path}: models[0].init_args.output_dim: 'output_dim' is set by the harness")
    model["init_args"] = {"num_experts": 2}
    preflight(load_suite(write_suite(tmp_path, data)))  # input_shape and output_dim supplied: not missing


def test_every_grid_point_is_checked_as_a_run_is(tmp_path):
    """A strategy's model_args reach the model only in the grid points; they are checked there,
    as clbench run checks the point's config, before any run starts."""
    data = smoke(strategies=["naive", {"class_path": "joint", "model_args": {"hiden": 8}}])
    path = write_suite(tmp_path, data)
    with pytest.raises(UserError) as info:
        preflight(load_suite(path))
    line = info.value.one_line()
    assert line.startswith(f"{path} (joint · digits-domains · mlp · order default · seed 0): "
                           "model.init_args.hiden: unknown argument 'hiden'")
    assert "did you mean 'hidden'" in line


def test_a_scheduler_only_a_run_checked_is_refused_before_the_grid(tmp_path):
    data = smoke()
    data["base"]["train"]["scheduler"] = {"class_path": "cosine", "init_args": {"warmup_ratio": 2}}
    with pytest.raises(UserError) as info:
        preflight(load_suite(write_suite(tmp_path, data)))
    assert "train.scheduler.init_args.warmup_ratio" in info.value.one_line()
