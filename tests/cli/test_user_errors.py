"""Bad input that used to end in a traceback, or blamed the wrong place: each is one line now."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from clbench import registry
from clbench.plugins.build import build_strategy, optimizer_factory, preflight
from clbench.config.load import blame_overrides, load_config, resolve_config
from clbench.config.yaml_files import read_yaml
from clbench.errors import UserError
from helpers import REPO, run_cli, tiny_config


def write(tmp_path: Path, raw: dict, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize("lr", [-0.01, math.nan, math.inf])
def test_bad_learning_rate_is_refused_before_training(lr):
    cfg = resolve_config(tiny_config(train={"optimizer": {"class_path": "adam", "init_args": {"lr": lr}}}),
                         source="cfg.yaml")
    with pytest.raises(UserError) as info:
        preflight(cfg, "cfg.yaml")
    assert "cfg.yaml: train.optimizer.init_args.lr" in info.value.one_line()


def test_value_the_optimizer_refuses_is_refused_before_training():
    cfg = resolve_config(tiny_config(train={"optimizer": {"class_path": "adam",
                                                          "init_args": {"lr": 0.01, "betas": [0.9, 1.5]}}}),
                         source="cfg.yaml")
    with pytest.raises(UserError, match="cfg.yaml: train.optimizer.init_args: the optimizer refuses"):
        optimizer_factory(cfg, "cfg.yaml")


def test_nan_learning_rate_from_yaml_exits_2_with_one_line(tmp_path):
    raw = tiny_config()
    path = write(tmp_path, raw)
    path.write_text(path.read_text().replace("lr: 0.01", "lr: .nan"))
    proc = run_cli("run", "--config", str(path), "--output", str(tmp_path / "out"), env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "train.optimizer.init_args.lr" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "result.json").exists()


def test_negative_permutation_seed_is_refused():
    with pytest.raises(UserError, match="cfg.yaml: order: a permutation's seed must be >= 0"):
        resolve_config({"order": {"permutation": -3}}, source="cfg.yaml")
    with pytest.raises(UserError, match="command line: order"):
        resolve_config({}, source="cfg.yaml", overrides=["order={permutation: -3}"])


def test_negative_permutation_seed_is_refused_by_the_stream_too():
    from clbench.benchmarks.digits import digits_domains
    from clbench.data.streams import resolve_order

    with pytest.raises(UserError, match="order: a permutation's seed must be >= 0"):
        resolve_order(digits_domains(), {"permutation": -3})


def test_duplicate_key_is_refused(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("seed: 0\ntrain:\n  epochs: 3\n  batch_size: 32\n  epochs: 5\n")
    with pytest.raises(UserError) as info:
        read_yaml(path)
    assert info.value.one_line() == f"{path}: key 'epochs' is given twice (again at line 5) (keep one of them)"


def test_duplicate_key_in_an_override_is_refused():
    with pytest.raises(UserError, match="command line: strategy.init_args: key 'mem_size' is given twice"):
        resolve_config({}, overrides=["strategy.init_args={mem_size: 1, mem_size: 2}"])


def test_merge_keys_may_still_override(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("base: &b {epochs: 3, batch_size: 32}\ntrain:\n  <<: *b\n  epochs: 5\n")
    assert read_yaml(path)["train"] == {"epochs": 5, "batch_size": 32}


@pytest.mark.parametrize("text", ["", "\n\n", "# nothing here yet\n"])
def test_empty_config_is_refused(tmp_path, text):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match="cfg.yaml: the file is empty"):
        load_config(path)


def _blamed(path: Path, overrides: list[str]) -> str:
    try:
        cfg = load_config(path, overrides)
        preflight(cfg, str(path))
    except UserError as err:
        return blame_overrides(err, str(path), overrides).one_line()
    raise AssertionError("no error")


@pytest.mark.parametrize("override, field", [
    ("strategy.init_args.mem_siz=3", "strategy.init_args.mem_siz"),
    ("strategy.init_args.mem_size=abc", "strategy.init_args.mem_size"),
    ("model.class_path=mlpp", "model.class_path"),
    ("strategy=nope", "strategy.class_path"),
    ("order={permutation: x}", "order"),
])
def test_wrong_override_is_blamed_on_the_command_line(tmp_path, override, field):
    path = write(tmp_path, tiny_config(strategy={"class_path": "replay", "init_args": {"mem_size": 50}}))
    line = _blamed(path, [override])
    assert line.startswith(f"command line: {field}: ") and str(path) not in line


def test_config_error_is_still_blamed_on_the_file(tmp_path):
    path = write(tmp_path, tiny_config(strategy={"class_path": "replay", "init_args": {"mem_siz": 50}}))
    assert _blamed(path, ["train.epochs=2"]).startswith(f"{path}: strategy.init_args.mem_siz: ")


def test_class_path_override_drops_the_old_components_init_args(tmp_path):
    path = write(tmp_path, tiny_config(strategy={"class_path": "replay", "init_args": {"mem_size": 50}}))
    for overrides in (["strategy.class_path=ewc", "strategy.init_args.ewc_lambda=100"],
                      ["strategy.init_args.ewc_lambda=100", "strategy.class_path=ewc"]):
        cfg = load_config(path, overrides)
        assert cfg["strategy"] == {"class_path": "ewc", "init_args": {"ewc_lambda": 100}}
        preflight(cfg, str(path))
    assert load_config(path, ["strategy.class_path=replay"])["strategy"]["init_args"] == {"mem_size": 50}


FAILS_AT_IMPORT = '''\
import math

RATE = 1 / 0
'''

FAILS_IN_INIT = '''\
from clbench.strategy import Strategy


def scale(strength):
    return strength / 0


class Fragile(Strategy):
    def __init__(self, strength: float = 1.0):
        super().__init__()
        self.strength = scale(strength)
'''


def test_plugin_failing_at_import_names_its_own_line(tmp_path, monkeypatch):
    """Inside the working directory the file is named relative to it."""
    plugin = tmp_path / "fails_at_import.py"
    plugin.write_text(FAILS_AT_IMPORT)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as info:
        registry.resolve("strategies", f"{plugin}:Anything", where="cfg.yaml: strategy.class_path")
    line = info.value.one_line()
    assert line.startswith("cfg.yaml: strategy.class_path: fails_at_import.py:3: ZeroDivisionError: division by zero")


def test_plugin_module_failing_at_import_names_its_own_line(tmp_path, monkeypatch):
    (tmp_path / "broken_pkg_mod.py").write_text(FAILS_AT_IMPORT)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match=r"broken_pkg_mod.py:3: ZeroDivisionError"):
        registry.resolve("strategies", "broken_pkg_mod:Anything")


def test_plugin_init_raising_names_its_own_line(tmp_path, monkeypatch):
    """Outside the working directory the file is named by its whole path."""
    plugin = tmp_path / "fragile.py"
    plugin.write_text(FAILS_IN_INIT)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    cfg = resolve_config(tiny_config(strategy={"class_path": f"{plugin}:Fragile"}), source="cfg.yaml")
    with pytest.raises(UserError) as info:
        build_strategy(cfg, "cfg.yaml")
    line = info.value.one_line()
    assert line.startswith("cfg.yaml: strategy: ") and f"{plugin}:5: ZeroDivisionError" in line
    assert "building Fragile" in line


def test_harness_bug_keeps_its_traceback(monkeypatch):
    """Only plugins' exceptions become one-line errors: the harness's own are bugs."""
    from clbench.plugins import build

    def broken():
        raise RuntimeError("a bug")

    broken.__module__ = build.__name__  # as if defined in the harness's own code
    with pytest.raises(RuntimeError, match="a bug"):
        build.call_plugin(broken, {}, "cfg.yaml: strategy.init_args", "cfg.yaml")


def test_plugin_init_raising_through_the_cli_is_one_line(tmp_path):
    plugin = tmp_path / "my_strategy.py"
    plugin.write_text(FAILS_IN_INIT)
    path = write(tmp_path, tiny_config(strategy={"class_path": "my_strategy.py:Fragile"}))
    proc = run_cli("run", "--config", str(path), "--output", str(tmp_path / "out"), cwd=tmp_path,
                   env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "my_strategy.py:5: ZeroDivisionError: float division by zero" in lines[0], lines


def test_compare_json_destination_problems_are_one_line(tmp_path, capsys):
    from clbench.cli.main import main

    board = REPO / "leaderboard"
    a_file = tmp_path / "note.txt"
    a_file.write_text("x")
    for target, message in ((tmp_path, "is a folder"), (a_file / "sub" / "c.json", "is a file, not a folder")):
        assert main(["compare", str(board), "--json", str(target)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("clbench: error: --json: ") and message in err and "\n" not in err
    assert a_file.read_text() == "x"


def test_compare_json_into_a_missing_folder_creates_it(tmp_path, capsys):
    from clbench.cli.main import main

    target = tmp_path / "new" / "deeper" / "compare.json"
    assert main(["compare", str(REPO / "leaderboard"), "--json", str(target)]) == 0
    assert target.is_file() and f"wrote {target}" in capsys.readouterr().out
