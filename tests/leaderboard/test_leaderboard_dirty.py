"""No dirty numbers: ``leaderboard run`` into clbench's repository refuses uncommitted code unless told.

The repository here is a temporary one, so the tests do not depend on the state of the real
checkout: a small repository stands in for clbench's (``clbench.results.provenance.code_repo``) in
process, and one test copies the package into a fresh repository and runs the real command.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from clbench.results import provenance
from clbench.cli.main import main
from clbench.errors import UserError
from clbench.leaderboard.execute import plan_suite
from clbench.leaderboard.suite import load_suite
from helpers import SMOKE, smoke, write_suite

REPO = Path(__file__).resolve().parents[2]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=repo,
                          check=True, capture_output=True, text=True).stdout


def init_repo(repo: Path, files: dict[str, str]) -> Path:
    repo.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "start")
    return repo


@pytest.fixture
def fake_code_repo(tmp_path, monkeypatch):
    """A git repository with one tracked code file, standing in for the one clbench runs from."""
    repo = init_repo(tmp_path / "repo", {"code.py": "x = 1\n", "README.md": "", "lb/entries/.keep": ""})
    monkeypatch.setattr(provenance, "code_repo", lambda: repo.resolve())
    return repo


def quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


def test_uncommitted_code_is_refused_in_the_repository_and_allowed_with_the_flag(fake_code_repo, tmp_path, capsys):
    suite = str(write_suite(tmp_path, smoke(orders=["default"])))  # naive and joint, one order
    (fake_code_repo / "code.py").write_text("x = 2\n")
    out = fake_code_repo / "board"
    assert main(["leaderboard", "run", "--no-render", "--suite", suite, "--output", str(out), "--no-progress"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and err.startswith("clbench: error: --output: ") and "code.py" in err, err
    assert "--allow-dirty" in err and "uncommitted changes" in err
    assert not out.exists()  # nothing written, not even the folder

    assert main(["leaderboard", "run", "--no-render", "--suite", suite, "--output", str(out), "--no-progress", "--allow-dirty"]) == 0
    entries = [json.loads(p.read_text()) for p in sorted((out / "entries").glob("*.json"))]
    assert entries and all(e["env"]["git_dirty"] is True for e in entries)
    assert {e["env"]["git_commit"] for e in entries} == {git(fake_code_repo, "rev-parse", "HEAD").strip()}
    assert main(["leaderboard", "render", str(out)]) == 0
    readme = (out / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| ") and not line.startswith("| Rank")]
    assert rows and all(" †" in row.split("|")[3] for row in rows), rows  # every row's strategy cell (after Rank and Group) is marked
    assert f"{len(entries)} made from uncommitted code (†)" in readme
    assert "† Made from uncommitted code" in readme and "cannot rerun them" in readme
    page = (out / "index.html").read_text()
    assert page.count('<sup class="dirty"') == len(rows) and '<p class="note dirty">' in page
    capsys.readouterr()
    assert main(["leaderboard", "verify", str(out)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(entries) + 1
    assert all("cannot rerun: made from uncommitted code" in line for line in lines[:-1]), lines


def test_leaderboard_files_are_no_code_and_folders_outside_the_repository_are_not_checked(fake_code_repo,
                                                                                         tmp_path):
    suite = load_suite(SMOKE)
    inside = fake_code_repo / "lb"
    (inside / "entries" / ".keep").write_text("changed\n")  # a leaderboard's own (tracked) files changed
    (fake_code_repo / "README.md").write_text("changed\n")
    _, todo, _ = plan_suite(suite, inside, console=quiet())
    assert len(todo) == len(suite.runs)
    (fake_code_repo / "code.py").write_text("x = 2\n")
    with pytest.raises(UserError, match="uncommitted changes to tracked code \\(code.py\\)"):
        plan_suite(suite, fake_code_repo / "new" / "nested", console=quiet())
    assert not (fake_code_repo / "new").exists()
    outside = tmp_path / "scratch" / "lb"
    _, todo, _ = plan_suite(suite, outside, console=quiet())  # a scratch folder: not checked
    assert len(todo) == len(suite.runs) and (outside / "suite.json").is_file()
    git(fake_code_repo, "commit", "-qm", "code", "code.py")
    _, todo, _ = plan_suite(suite, fake_code_repo / "lb2", console=quiet())  # committed: clean
    assert len(todo) == len(suite.runs)
    assert provenance.git_state() == (git(fake_code_repo, "rev-parse", "HEAD").strip(), False)


def test_nothing_to_run_is_not_refused(fake_code_repo):
    """With every grid point done, run only prints the table: it writes no entry, so it is not refused."""
    suite = load_suite(SMOKE)
    board = fake_code_repo / "lb"
    git(fake_code_repo, "rm", "-q", "lb/entries/.keep")
    git(fake_code_repo, "commit", "-qm", "empty")
    plan_suite(suite, board, console=quiet())
    for spec in suite.runs:  # stand-ins for finished entries, written from the clean tree
        from clbench.leaderboard.entries import failed_entry, write_entry

        write_entry(board, failed_entry(spec.config, "stand-in", env={}, wall_seconds=0.0))
    (fake_code_repo / "code.py").write_text("x = 3\n")
    outcome, todo, _ = plan_suite(suite, board, console=quiet())
    assert todo == [] and len(outcome.skipped) == len(suite.runs)
    with pytest.raises(UserError, match="uncommitted changes"):
        plan_suite(suite, board, retry_failed=True, console=quiet())


def test_the_real_command_refuses_from_a_copied_repository(tmp_path):
    """clbench's own code in a fresh repository, one tracked file changed: exit 2, one line, nothing written."""
    copy = tmp_path / "clbench-copy"
    copy.mkdir()
    shutil.copytree(REPO / "clbench", copy / "clbench", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    (copy / "configs" / "suites").mkdir(parents=True)
    shutil.copy(SMOKE, copy / "configs" / "suites" / "smoke.yaml")
    init_repo(copy, {})
    with open(copy / "clbench" / "strategies" / "naive.py", "a") as f:
        f.write("\n# an uncommitted change\n")
    env = {**os.environ, "PYTHONPATH": str(copy)}
    done = subprocess.run([sys.executable, "-m", "clbench.cli.main", "leaderboard", "run", "--no-render", "--suite",
                           "configs/suites/smoke.yaml", "--output", "leaderboards/smoke"], cwd=copy, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip()
    assert "\n" not in err and err.startswith("clbench: error: --output: ") and "clbench/strategies/naive.py" in err, err
    assert not (copy / "leaderboards").exists()
    assert git(copy, "status", "--porcelain") == " M clbench/strategies/naive.py\n"
