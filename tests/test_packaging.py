"""What an install contains: clbench with its built-in plugins inside it (``clbench.strategies``,
``clbench.benchmarks``), and nothing at the top, so a user's own ``strategies`` package is never
shadowed by, or taken for, the harness's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile

import pytest

from helpers import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
DATA_FOLDERS = {"clbench.benchmarks.assets", "clbench.leaderboard.templates"}  # packaged files, no code


def _package_folders() -> set[str]:
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "clbench").rglob("__init__.py")}
    return {name for name in found if "__pycache__" not in name}


def test_the_package_list_names_every_package_folder():
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert set(setuptools["packages"]) == _package_folders() | DATA_FOLDERS
    assert "package-dir" not in setuptools  # every package lives where it installs


def test_built_in_plugins_are_declared_under_clbench():
    for group, entries in PYPROJECT["project"]["entry-points"].items():
        for name, target in entries.items():
            assert target.startswith("clbench."), (group, name, target)


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return env


def test_the_installed_package_has_no_top_level_strategies(tmp_path):
    """Outside the repository, `import strategies` fails and the public API imports."""
    code = ("import importlib.util as u, clbench.strategies.naive as n, clbench.benchmarks.digits as d\n"
            "from clbench import Strategy, Objective\n"
            "assert issubclass(n.Naive, Strategy)\n"
            "print(u.find_spec('strategies'), u.find_spec('benchmarks'))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_clean_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "None"]
    failed = subprocess.run([sys.executable, "-c", "import strategies"], cwd=tmp_path, env=_clean_env(),
                            capture_output=True, text=True, timeout=60)
    assert failed.returncode == 1 and "No module named 'strategies'" in failed.stderr


@pytest.mark.slow
def test_the_wheel_puts_plugins_inside_clbench(tmp_path):
    """What a non-editable install gets: clbench/strategies/*.py and the benchmark assets."""
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("clbench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"clbench"}
    assert {"clbench/strategies/naive.py", "clbench/benchmarks/digits.py", "clbench/models/layers/grow.py",
            "clbench/leaderboard/templates/index.html.j2"} <= names, sorted(names)
    assert any(n.startswith("clbench/benchmarks/assets/trace-mini-tokenizer/") for n in names)


def test_a_users_own_strategies_package_is_a_plugin(tmp_path, monkeypatch):
    """Recognised by where it lives: a user's `strategies` package is the user's code (its file
    is recorded with a hash), the harness's clbench.strategies is not."""
    from clbench import registry

    (tmp_path / "strategies").mkdir()
    (tmp_path / "strategies" / "__init__.py").write_text("")
    (tmp_path / "strategies" / "mine.py").write_text(
        "from clbench import Strategy\n\n\nclass Mine(Strategy):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "strategies", raising=False)
    mine = registry.resolve("strategies", "strategies.mine:Mine")
    assert registry.is_plugin(mine)
    source = registry.plugin_source("strategies.mine:Mine")
    assert source is not None and source["path"] == str((tmp_path / "strategies" / "mine.py").resolve())
    naive = registry.resolve("strategies", "naive")
    assert not registry.is_plugin(naive) and registry.plugin_source("naive") is None
    monkeypatch.delitem(sys.modules, "strategies.mine")
    monkeypatch.delitem(sys.modules, "strategies")
