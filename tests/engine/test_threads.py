"""``clbench run --threads``: the setting reaches torch and the result, bad values are one line."""

import json

import pytest
from helpers import run_cli, tiny_config

from clbench.cli.run import auto_threads


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


@pytest.mark.parametrize("cores, trainer, expected", [
    (1, {}, 1), (2, {"accelerator": "cpu", "devices": 1}, 1), (3, {}, 1),
    (4, {}, 4), (16, {"devices": 1}, 16), (16, {"devices": 4, "strategy": "ddp"}, 4),
    (16, {"devices": [0, 1]}, 8), (16, {"devices": "auto"}, 16), (6, {"devices": 8}, 1), (8, None, 8),
])
def test_auto_threads(cores, trainer, expected):
    assert auto_threads(trainer, cores=cores) == expected
