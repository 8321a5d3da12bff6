"""A received leaderboard folder whose parts are of the wrong kind (README.md a folder; pages,
entries or runs a file) is refused as one line naming the part, with nothing written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from clbench.cli.main import main

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "leaderboard"


def _snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def _board(tmp_path: Path, name: str) -> Path:
    out = tmp_path / "lb"
    shutil.copytree(COMMITTED, out)
    path = out / name
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    if name in ("pages", "entries", "runs"):
        path.write_text("not a folder\n")
    else:
        path.mkdir()
        (path / "inside.txt").write_text("a folder's file\n")
    return out


CASES = [("render", "README.md", "is a folder, where a leaderboard keeps the tables as Markdown in a file"),
         ("render", "index.html", "is a folder"),
         ("render", "pages", "is a file, where a leaderboard keeps each table row's page in a folder"),
         ("render", "entries", "is a file, where a leaderboard keeps one JSON entry per run in a folder"),
         ("render", "runs", "is a file, where a leaderboard keeps the working folders of runs in progress"),
         ("verify", "entries", "is a file"),
         ("run", "runs", "is a file"),
         ("run", "README.md", "is a folder")]


@pytest.mark.parametrize("command,name,what", CASES, ids=[f"{c}-{n}" for c, n, _ in CASES])
def test_a_part_of_the_wrong_kind_is_one_line_naming_it(tmp_path, capsys, command, name, what):
    out = _board(tmp_path, name)
    argv = ["leaderboard", command, str(out)]
    if command == "run":
        argv = ["leaderboard", "run", "--no-render", "--suite", str(REPO / "configs/suites/quickstart.yaml"), "--output", str(out),
                "--no-progress"]
    before = _snapshot(out)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith(f"clbench: error: {out / name}: {name} {what}"), err
    assert err.endswith("then run the command again)"), err
    assert _snapshot(out) == before  # nothing written, nothing deleted
