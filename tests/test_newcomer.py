"""What a newcomer meets first: the README's commands, the printed result, the progress line,
and how a plugin is identified."""

from __future__ import annotations

import hashlib
import io
import re
import shlex
from types import SimpleNamespace

import pytest
import torch

from clbench import registry
from clbench.plugins.build import preflight
from clbench.config.load import load_config, rejoin_overrides, resolve_config
from helpers import REPO

README = (REPO / "README.md").read_text()


def readme_command(marker: str) -> list[str]:
    """The README's shell command containing ``marker``, split exactly as a POSIX shell would."""
    block = re.search(r"```bash\n(.*?)```", README[README.index("## Quickstart"):], re.S).group(1)
    joined = block.replace("\\\n", " ")
    line = next(line for line in joined.splitlines() if marker in line)
    return shlex.split(line, comments=True)


def test_readme_ewc_command_works_as_a_shell_splits_it():
    words = readme_command("runs/ewc")
    assert words[:2] == ["clbench", "run"]
    config = words[words.index("--config") + 1]
    overrides = words[words.index("--output") + 2:]
    cfg = load_config(REPO / config, overrides)
    assert cfg["strategy"] == {"class_path": "ewc", "init_args": {"ewc_lambda": 100}}
    assert cfg["train"]["epochs"] == 5
    preflight(cfg, config)


def test_flow_values_split_by_the_shell_are_rejoined():
    words = shlex.split("strategy.init_args={ewc_lambda: 100, gamma: 0.9} order={permutation: 3} train.epochs=2")
    assert rejoin_overrides(words) == ["strategy.init_args={ewc_lambda: 100, gamma: 0.9}",
                                       "order={permutation: 3}", "train.epochs=2"]
    cfg = resolve_config({"strategy": "ewc"}, overrides=words)
    assert cfg["strategy"]["init_args"] == {"ewc_lambda": 100, "gamma": 0.9}
    assert cfg["order"] == {"permutation": 3} and cfg["train"]["epochs"] == 2
    assert resolve_config({}, overrides=shlex.split("order=[rot90, rot0]"))["order"] == ["rot90", "rot0"]


def test_readme_says_what_a_hook_receives():
    section = README[README.index("## Add a strategy"):README.index("## More")]
    prose = re.sub(r"```.*?```", "", section, flags=re.S)
    assert "`ctx.model` is the network" in prose and "`clbench.StrategyContext`" in prose


def long_result(n: int = 14) -> dict:
    names = [f"experience_{i:02d}" for i in range(n)]
    return {"experiences": names, "strategy": {"name": "replay"}, "benchmark": {"name": "long-stream"},
            "order_label": "default", "seed": 0, "r_init": [0.1] * n,
            "r_matrix": [[0.5 + 0.01 * i] * n for i in range(n)],
            "scores": {"acc": 0.5, "aia": 0.6, "bwt": -0.1, "fwt": 0.0, "forgetting": 0.1}}


def test_result_tables_are_not_cut_off_a_terminal(capsys, monkeypatch):
    from clbench.results.report import print_result

    monkeypatch.delenv("COLUMNS", raising=False)
    print_result(long_result())
    out = capsys.readouterr().out
    assert "…" not in out
    header = next(line for line in out.splitlines() if "after \\ test" in line)
    assert all(f"experience_{i:02d}" in header for i in range(14))  # one line: nothing wrapped
    assert "forgetting" in out and "-10.0" in out


def test_result_tables_keep_the_terminal_width_when_asked(monkeypatch, capsys):
    from clbench.results.report import print_result

    monkeypatch.setenv("COLUMNS", "100")
    print_result(long_result())
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 100


def test_a_result_whose_r_is_an_error_prints_it_in_its_own_unit(capsys, monkeypatch):
    """A squared error recorded as no percentage is printed as measured (2.34), not as 234.0 %."""
    from clbench.results.report import print_result

    monkeypatch.delenv("COLUMNS", raising=False)
    result = long_result(3)
    result["r_matrix"] = [[2.34, 5.0, 5.0], [3.1, 1.2, 5.0], [3.3, 2.2, 0.75]]
    result["scores"] = {"acc": 2.0833, "aia": 2.1, "bwt": -2.68, "fwt": 0.0, "forgetting": 2.68}
    result["r_metric"] = {"names": ["mse"] * 3, "higher_is_better": False}
    result["metrics"] = {"mse": {"title": "MSE", "higher_is_better": False, "percent": False}}
    print_result(result)
    out = capsys.readouterr().out
    assert "R matrix (mse)" in out and "scores (mse," in out and "(%" not in out
    assert "2.34" in out and "2.08" in out and "-2.68" in out and "234" not in out and "208" not in out


def progress_description(bar) -> str:
    return bar.progress.tasks[0].description


def test_progress_shows_no_stale_or_nan_loss():
    from rich.console import Console

    from clbench.engine.progress import ContinualProgress

    bar = ContinualProgress(2, console=Console(file=io.StringIO()), refresh_s=3600)
    trainer = SimpleNamespace(is_global_zero=True, current_epoch=0, num_training_batches=4)
    bar.start_stage(0, "a", epochs=1, first_epoch=0)
    bar.on_train_epoch_start(trainer, None)
    assert "nan" not in progress_description(bar) and progress_description(bar).endswith("loss —")
    bar.on_train_batch_end(trainer, None, {"loss": torch.tensor(2.5)}, None, 0)  # first step: shown at once
    assert progress_description(bar).endswith("loss 2.5000")
    bar.on_train_batch_end(trainer, None, {"loss": torch.tensor(1.25)}, None, 1)  # within the refresh interval
    bar.on_train_epoch_end(trainer, None)
    assert progress_description(bar).endswith("loss 1.2500")  # the epoch's last loss
    trainer.current_epoch = 1
    bar.start_stage(1, "b", epochs=1, first_epoch=1)
    bar.on_train_epoch_start(trainer, None)
    assert progress_description(bar) == "exp 2/2 b · epoch 1/1 · loss —"
    bar.close()


PLUGIN = '''\
from clbench.strategy import Strategy


class Mine(Strategy):
    pass
'''


def test_plugin_source_of_a_file_plugin(tmp_path, monkeypatch):
    plugin = tmp_path / "mine.py"
    plugin.write_text(PLUGIN)
    monkeypatch.chdir(tmp_path)
    source = registry.plugin_source("mine.py:Mine")
    assert source == {"path": str(plugin.resolve()), "sha256": hashlib.sha256(plugin.read_bytes()).hexdigest()}
    plugin.write_text(PLUGIN + "\n# changed\n")
    assert registry.plugin_source("mine.py:Mine")["sha256"] != source["sha256"]


def test_plugin_source_of_an_import_path_plugin(tmp_path, monkeypatch):
    (tmp_path / "my_plugins_pkg").mkdir()
    (tmp_path / "my_plugins_pkg" / "__init__.py").write_text("")
    module = tmp_path / "my_plugins_pkg" / "strat.py"
    module.write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("my_plugins_pkg.strat:Mine", "my_plugins_pkg.strat.Mine"):
        assert registry.plugin_source(name) == {"path": str(module.resolve()),
                                                "sha256": hashlib.sha256(module.read_bytes()).hexdigest()}


@pytest.mark.parametrize("name", ["naive", "ewc", "mlp", "digits-domains", "clbench.strategies.ewc:EWC", "adam", ""])
def test_built_ins_have_no_plugin_source(name):
    assert registry.plugin_source(name) is None


def test_file_plugins_get_the_same_module_name_in_every_process(tmp_path):
    """A result records the class's module: it must not change with Python's hash seed."""
    import os
    import subprocess
    import sys

    plugin = tmp_path / "mine.py"
    plugin.write_text(PLUGIN)
    code = (f"from clbench import registry; c = registry.resolve('strategies', {str(plugin) + ':Mine'!r}); "
            "print(c.__module__)")
    names = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip()
             for seed in ("1", "2")}
    assert len(names) == 1 and next(iter(names)).startswith("clbench_user_mine_")
