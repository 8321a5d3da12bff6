"""Warnings printed by installed packages never reach the user's terminal; the user's own do."""

from __future__ import annotations

import textwrap

import yaml
from helpers import REPO, run_cli, tiny_config

from clbench.quiet import is_dependency_file


def test_installed_and_stdlib_files_are_dependencies():
    import json

    assert is_dependency_file("/usr/lib/python3/dist-packages/foo/__init__.py")
    assert is_dependency_file("/venv/lib/python3.11/site-packages/qpsolvers/solvers/__init__.py")
    assert is_dependency_file(json.__file__)
    assert not is_dependency_file(str(REPO / "clbench" / "runner.py"))
    assert not is_dependency_file("/home/me/research/my_strategy.py")


def _plugin_run(tmp_path, *, extra_args=()):
    """A config whose strategy is a plugin file importing a package that warns at import (as
    qpsolvers does when it finds no solver), with a bad argument so the run stops with a
    one-line error right after the import."""
    installed = tmp_path / "site-packages" / "noisydep"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text(textwrap.dedent("""
        import warnings
        warnings.warn("no QP solver found on your system, you can install solvers from PyPI by "
                      "``pip install qpsolvers[open_source_solvers]``")
    """))
    plugin = tmp_path / "my_strategy.py"
    plugin.write_text(textwrap.dedent("""
        import warnings
        import noisydep  # noqa: F401
        from clbench.strategy import Strategy

        warnings.warn("my plugin's own warning")

        class Mine(Strategy):
            def __init__(self, strength: float = 1.0):
                super().__init__()
                self.strength = strength
    """))
    cfg = tiny_config(strategy={"class_path": f"{plugin}:Mine", "init_args": {"strenght": 2.0}})
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    env = {"PYTHONPATH": str(tmp_path / "site-packages"), "PYTHONWARNINGS": "", "CLBENCH_SHOW_WARNINGS": ""}
    return run_cli("run", "--config", str(config), "--output", str(tmp_path / "out"), *extra_args, env=env)


def test_dependency_import_warning_is_not_printed(tmp_path):
    proc = _plugin_run(tmp_path)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "no QP solver" not in proc.stderr
    errors = [line for line in lines if line.startswith("clbench: error:")]
    assert len(errors) == 1 and "strenght" in errors[0]
    # The user's own warning is theirs to see.
    assert any("my plugin's own warning" in line for line in lines)
