"""The Python API: the same checks, runs and files as the command line, typed results."""

from __future__ import annotations

import json
import sys

import pytest

import clbench
from clbench.errors import UserError
from helpers import smoke, tiny_config, write_suite


def test_import_is_cheap_and_the_api_is_lazy():
    import subprocess

    code = "import sys, clbench; clbench.load_config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    assert clbench.Strategy.__name__ == "Strategy" and "run" in dir(clbench)
    with pytest.raises(AttributeError):
        clbench.nosuch


def test_run_returns_what_result_json_holds(tmp_path):
    result = clbench.run(tiny_config(), tmp_path / "out", overrides=["train.epochs=1"], threads=1)
    record = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result.r_matrix == record["r_matrix"] and result.r_init == record["r_init"]
    assert result.scores == record["scores"] and result.experiences == ["rot0", "rot90", "rot180"]
    assert result.path == tmp_path / "out" and result.config["train"]["epochs"] == 1
    assert clbench.RunResult.load(tmp_path / "out") == result
    # a rerun into the same folder is refused as on the command line
    with pytest.raises(UserError, match="already holds a finished run"):
        clbench.run(tiny_config(), tmp_path / "out")


def test_bad_config_raises_the_cli_message(tmp_path):
    with pytest.raises(UserError) as err:
        clbench.load_config(tiny_config(), ["train.epochs=-1"])
    assert err.value.one_line().startswith("command line: train.epochs")
    path = tmp_path / "c.yaml"
    path.write_text("seed: 0\nstrategy: replai\n")
    with pytest.raises(UserError, match="unknown strategy 'replai'"):
        clbench.load_config(path)


def test_leaderboard_run_table_and_compare(tmp_path):
    suite = write_suite(tmp_path, smoke())
    board = clbench.run_leaderboard(suite, tmp_path / "board")
    rows = board.table()
    assert {r["strategy"] for r in rows} == {s if isinstance(s, str) else s["class_path"]
                                             for s in smoke()["strategies"]}
    assert all(0.0 <= r["scores"]["acc"]["mean"] <= 1.0 for r in rows)
    assert len(board.results()) == len(board.entries)
    report = clbench.compare(tmp_path / "board")
    assert report["benchmarks"] and report["metric"] == "acc"
    again = clbench.load_leaderboard(tmp_path / "board")
    assert [e["config_hash"] for e in again.entries] == [e["config_hash"] for e in board.entries]
