"""clbench run --print-config: the resolved config as YAML, checked, and no run."""

from __future__ import annotations

import yaml
from helpers import tiny_config

from clbench.cli.main import main
from clbench.config.load import resolve_config


def test_print_config_prints_the_resolved_config_and_trains_nothing(tmp_path, write_yaml, capsys):
    config = write_yaml(tiny_config())
    out = tmp_path / "out"
    assert main(["run", "-c", str(config), "-o", str(out), "--print-config", "train.epochs=2"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == resolve_config(tiny_config(), overrides=["train.epochs=2"]) and printed["train"]["epochs"] == 2
    assert not out.exists()


def test_print_config_refuses_a_bad_init_arg_as_a_run_would(tmp_path, write_yaml, capsys):
    config = write_yaml(tiny_config(strategy={"class_path": "replay", "init_args": {"mem_sise": 10}}))
    assert main(["run", "-c", str(config), "-o", str(tmp_path / "out"), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mem_sise" in err and "Traceback" not in err
