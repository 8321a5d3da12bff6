"""``clbench run --threads``: the setting reaches torch and the result, bad values are one line.
(How ``auto`` and a number are decided: tests/test_limits.py.)"""

import json

import pytest
from helpers import run_cli, tiny_config


def test_threads_option_sets_torch_threads_and_is_recorded(tmp_path, write_yaml):
    proc = run_cli("run", "--config", str(write_yaml(tiny_config())), "--output", str(tmp_path / "out"),
                   "--no-progress", "--threads", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["env"]["torch_threads"] == 2


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_bad_thread_counts_are_one_line_errors(tmp_path, write_yaml, value):
    proc = run_cli("run", "--config", str(write_yaml(tiny_config())), "--output", str(tmp_path / "out"),
                   "--threads", value)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--threads" in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
