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
    assert [e.config_hash for e in again.entries] == [e.config_hash for e in board.entries]


@pytest.mark.parametrize("call, message", [
    (lambda: clbench.run(None), "config: expected a config file path or a mapping, got NoneType None "
                                "(give a YAML file's path, or the config as a dict)"),
    (lambda: clbench.run(5), "config: expected a config file path or a mapping, got int 5"),
    (lambda: clbench.load_config(""), "config: expected a config file path or a mapping, got str ''"),
    (lambda: clbench.run(tiny_config(), output=123), "output: expected a path (str or pathlib.Path), got int 123 "
                                                     "(give output as a path, or None)"),
    (lambda: clbench.run(tiny_config(), overrides=[1]), "overrides[0]: expected a 'key.path=value' string, got int 1"),
    (lambda: clbench.run(tiny_config(), overrides="seed=1"),
     "overrides: expected a list of overrides, got a single str 'seed=1' (put it in a list: overrides=['seed=1'])"),
    (lambda: clbench.load_config(tiny_config(), overrides=5), "overrides: expected a list of overrides, got int 5"),
    (lambda: clbench.run(tiny_config(), threads=0), "threads: must be >= 1, got 0 (set threads to a whole number"),
    (lambda: clbench.run(tiny_config(), threads=-1), "threads: must be >= 1, got -1"),
    (lambda: clbench.run(tiny_config(), threads="2"), "threads: expected int, got str '2'"),
    (lambda: clbench.run(tiny_config(), threads=True), "threads: expected int, got bool True"),
    (lambda: clbench.RunResult.load(3), "folder: expected a path (str or pathlib.Path), got int 3"),
])
def test_wrong_types_raise_one_line_user_errors(call, message):
    """Each was a raw TypeError or AttributeError, or (a string of overrides) read one character at a time."""
    with pytest.raises(UserError) as info:
        call()
    assert info.value.one_line().startswith(message), info.value.one_line()


@pytest.mark.parametrize("text, message", [
    ("", "the file is empty"), ('{"r_matrix": [[0.5]', "not valid JSON (line 1, column 20)"),
    ("[1, 2]", "not a finished run's result: experiences, r_matrix, r_init, scores, config, config_hash missing"),
    ('{"status": "ok"}', "not a finished run's result: experiences, r_matrix"),
])
def test_run_result_load_of_a_damaged_result_is_one_line(tmp_path, text, message):
    (tmp_path / "result.json").write_text(text)
    with pytest.raises(UserError) as info:
        clbench.RunResult.load(tmp_path)
    assert info.value.one_line().startswith(f"{tmp_path / 'result.json'}: {message}"), info.value.one_line()
    assert info.value.one_line().endswith("(rerun the run into that folder with overwrite=True "
                                          "(or clbench run --overwrite))")
    (tmp_path / "result.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserError, match="not a UTF-8 text file"):
        clbench.RunResult.load(tmp_path)
