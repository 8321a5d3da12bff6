"""Where a command writes must be said: an empty ``--output`` (or leaderboard folder) is refused
instead of meaning the current folder, and ``clbench.run_leaderboard`` takes a suite's file."""

from __future__ import annotations

import pytest

import clbench
from clbench.cli.main import main
from clbench.errors import UserError
from helpers import REPO, smoke, tiny_config, write_suite

QUICKSTART = str(REPO / "configs" / "suites" / "quickstart.yaml")


@pytest.mark.parametrize("argv, flag", [
    (["run", "--config", "{config}", "--output", ""], "--output"),
    (["leaderboard", "run", "--no-render", "--suite", QUICKSTART, "--output", "", "--no-progress"], "--output"),
    (["leaderboard", "render", ""], "DIR"),
    (["leaderboard", "verify", ""], "DIR"),
], ids=["run", "leaderboard-run", "render", "verify"])
def test_an_empty_output_folder_is_refused_and_nothing_is_written(tmp_path, monkeypatch, capsys, write_yaml, argv,
                                                                  flag):
    config = str(write_yaml(tiny_config(), "config.yaml"))
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main([a.replace("{config}", config) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"clbench: error: {flag}: expected a folder, got an empty string, which would silently mean the "
                   f"current folder (give a folder (e.g. {flag + ' ' if flag.startswith('-') else ''}runs/NAME), "
                   "or '.' for the current one)"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_run_leaderboard_takes_a_suite_file_not_a_dict(tmp_path):
    with pytest.raises(UserError) as info:
        clbench.run_leaderboard(smoke(), tmp_path / "board")
    line = info.value.one_line()
    assert line.startswith("suite: expected a suite file's path, got a dict (write the suite to a YAML file") and \
        "\n" not in line, line
    with pytest.raises(UserError, match="^output: expected a path"):
        clbench.run_leaderboard(write_suite(tmp_path, smoke()), "")
    with pytest.raises(UserError, match="^suite: expected a path"):
        clbench.run_leaderboard(42, tmp_path / "board")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["suite.yaml"]  # nothing else written
