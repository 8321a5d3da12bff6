"""A leaderboard folder someone sent, read by ``leaderboard verify``, ``render`` and ``compare``:
files that are not regular files, too deep to read, numbers past a float, recorded thread counts
this machine cannot give, and a suite that came with the folder. Each is one line, and nothing
in the folder changes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from clbench.cli.main import main
from clbench.errors import UserError
from clbench.leaderboard import entries as E
from clbench.leaderboard.manifest import MANIFEST
from clbench.leaderboard.verify import cheapest
from clbench.limits import usable_cpus

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "leaderboard"
COMMANDS = {"render": ["leaderboard", "render"], "compare": ["compare"], "verify": ["leaderboard", "verify"]}


def _snapshot(root: Path) -> dict[str, object]:
    """Every path under ``root``: a regular file's bytes, else what it is (a link is not followed)."""
    def state(p: Path):
        if p.is_symlink():
            return f"link to {os.readlink(p)}"
        return p.read_bytes() if p.is_file() else "folder" if p.is_dir() else "other"
    return {str(p.relative_to(root)): state(p) for p in sorted(root.rglob("*"))}


def _one_line(capsys, prefix: str = "") -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"clbench: error: {prefix}") and "\n" not in err and "Traceback" not in err, err
    return err


@contextlib.contextmanager
def _memory_bounded(extra: int = 2 << 30):
    """A regression that reads a link to /dev/zero fails with MemoryError instead of filling the machine."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as status:
        used = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize"))
    limit = used + extra if hard == resource.RLIM_INFINITY else min(used + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _copy(source: Path, tmp_path: Path) -> Path:
    out = tmp_path / "lb"
    shutil.copytree(source, out)
    return out


def _entry_file(out: Path) -> Path:
    return sorted((out / "entries").glob("*.json"))[0]


# -- files that are not regular files, or too deep to read --------------------------------------------
def _not_regular(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


@pytest.mark.skipif(not Path("/dev/zero").exists() or not hasattr(os, "mkfifo"), reason="needs POSIX")
@pytest.mark.timeout(60)  # a FIFO opened for reading blocks: a regression fails here instead of hanging
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
@pytest.mark.parametrize("part", ["suite.json", "entry"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_link_to_a_device_or_a_fifo_is_refused_unread(tmp_path, capsys, command, part, kind):
    out = _copy(COMMITTED, tmp_path)
    path = out / MANIFEST if part == "suite.json" else _entry_file(out)
    _not_regular(path, kind)
    before = _snapshot(out)
    with _memory_bounded():
        assert main([*COMMANDS[command], str(out)]) == 2
    err = _one_line(capsys, f"{path}: ")
    what = "a named pipe (FIFO)" if kind == "fifo" else "a symbolic link to /dev/zero, which is a character device"
    assert f"{path}: {what}, where a regular file is expected (it is not read)" in err, err
    assert _snapshot(out) == before


@pytest.mark.parametrize("levels", [200_000, 100])
@pytest.mark.parametrize("part", ["suite.json", "entry"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_json_nested_too_deep_is_one_line_naming_the_file(tmp_path, capsys, command, part, levels):
    out = _copy(COMMITTED, tmp_path)
    path = out / MANIFEST if part == "suite.json" else _entry_file(out)
    path.write_text('{"a": ' * levels + "1" + "}" * levels)  # 100 parses, and is still refused
    before = _snapshot(out)
    assert main([*COMMANDS[command], str(out)]) == 2
    assert f"{path}: JSON nested more than 64 levels deep" in _one_line(capsys, f"{path}: ")
    assert _snapshot(out) == before


def test_an_oversized_file_is_refused_unread(tmp_path):
    from clbench.received import read_json

    path = tmp_path / "big.json"
    path.write_text("[" + "0," * 1000 + "0]")
    with pytest.raises(UserError, match=r"big.json: 2003 bytes, more than the 1000 clbench reads from one file"):
        read_json(path, fix="x", limit=1000)


# -- what an entry records: numbers past a float, thread counts -----------------------------------------
def _reseal(path: Path, change) -> Path:
    """Change an entry and recompute its hashes (and file name), as a forger would."""
    from clbench.config.load import config_hash

    entry = json.loads(path.read_text())
    change(entry)
    entry["config_hash"] = config_hash(entry["config"])
    entry["content_hash"] = E.content_hash(entry)
    path.unlink()
    new = path.parent / f"{entry['config_hash']}.json"
    new.write_text(json.dumps(entry, indent=2))
    return new


def test_a_number_past_any_float_is_outside_the_suite(clean_smoke_board, tmp_path, capsys):
    out = _copy(clean_smoke_board, tmp_path)
    forged = _reseal(cheapest(sorted((out / "entries").glob("*.json")), 1)[0],
                     lambda e: e["config"]["train"].update(epochs=10**400))
    before = _snapshot(out)
    assert main(["leaderboard", "verify", str(out)]) == 2
    err = _one_line(capsys, f"{forged}: ")
    assert f"{forged}: train.epochs is 1000" in err and "outside what suite smoke" in err and "--trust-code" in err
    assert _snapshot(out) == before


def _threads(value):
    return lambda e: e["execution"].update(torch_threads=value)


@pytest.mark.parametrize("value, message", [("abc", "input should be a valid integer, got 'abc'"),
                                            (-1, "input should be greater than or equal to 1, got -1"),
                                            (0, "input should be greater than or equal to 1, got 0")])
def test_recorded_threads_that_are_no_count_make_a_bad_entry(clean_smoke_board, tmp_path, capsys, value, message):
    out = _copy(clean_smoke_board, tmp_path)
    forged = _reseal(cheapest(sorted((out / "entries").glob("*.json")), 1)[0], _threads(value))
    before = _snapshot(out)
    assert main(["leaderboard", "render", str(out)]) == 2  # every reader refuses it
    assert f"{forged}: execution.torch_threads: {message}" in _one_line(capsys, f"{forged}: ")
    assert main(["leaderboard", "verify", str(out), forged.stem]) == 1  # verify: the entry does not hold
    line = capsys.readouterr().out.splitlines()[0]
    assert "differs from its own record" in line and f"execution.torch_threads: {message}" in line, line
    assert _snapshot(out) == before


def test_more_recorded_threads_than_cpus_cannot_be_rerun_here(clean_smoke_board, tmp_path, capsys):
    from clbench.leaderboard.cell import rerun

    out = _copy(clean_smoke_board, tmp_path)
    threads = usable_cpus() + 498
    forged = _reseal(cheapest(sorted((out / "entries").glob("*.json")), 1)[0], _threads(threads))
    before = _snapshot(out)
    assert main(["leaderboard", "verify", str(out), forged.stem]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert (f"cannot rerun: made with {threads} torch threads, and this process may use {usable_cpus()} CPUs "
            f"(fewer threads round differently: verify it on a machine with at least {threads} CPUs)") in lines[0]
    assert lines[1].startswith("1 verified: 0 ok, 0 differ, 1 cannot be rerun")
    with pytest.raises(UserError, match=f"execution.torch_threads: {threads} torch threads, but this process may use"):
        rerun(E.read_entry(forged), tmp_path / "scratch", source=str(forged))  # the rerun itself refuses too
    assert _snapshot(out) == before and not (tmp_path / "scratch").exists()


# -- the suite that bounds an entry must be the user's, not one that came with the folder ------------------
def _with_source(out: Path, source: str) -> None:
    manifest = json.loads((out / MANIFEST).read_text())
    (out / MANIFEST).write_text(json.dumps({**manifest, "source": source}))


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                   cwd=repo, check=True, capture_output=True)


def test_a_suite_beside_the_folder_bounds_nothing(clean_smoke_board, tmp_path, capsys, monkeypatch):
    from helpers import SMOKE, smoke, write_suite

    out = _copy(clean_smoke_board, tmp_path)
    base = smoke()["base"]
    beside = write_suite(tmp_path, smoke(base={**base, "train": {**base["train"], "epochs": 1_000_000_000}}))
    forged = _reseal(cheapest(sorted((out / "entries").glob("*.json")), 1)[0],
                     lambda e: e["config"]["train"].update(epochs=1_000_000_000))
    monkeypatch.chdir(out)
    for source in ("../suite.yaml", str(beside)):  # relative to the working directory, or absolute
        _with_source(out, source)
        before = _snapshot(out)
        assert main(["leaderboard", "verify", str(out)]) == 2
        err = _one_line(capsys, f"{out / MANIFEST}: ")
        assert (f"the suite its entries come from, {source}, is {beside}, which git does not track in the working "
                "directory's repository or in clbench's, so it may have come with the folder") in err, err
        assert _snapshot(out) == before
    # the same suite committed to the repository verify runs in bounds the entries; an untracked one does not
    repo = tmp_path / "mine"
    repo.mkdir()
    _git(repo, "init", "-q")
    shutil.copy(SMOKE, repo / "smoke.yaml")
    _git(repo, "add", "smoke.yaml")
    _git(repo, "commit", "-qm", "suite")
    shutil.copy(SMOKE, repo / "untracked.yaml")
    monkeypatch.chdir(repo)
    forged.unlink()
    honest = cheapest(sorted((out / "entries").glob("*.json")), 1)[0]
    _with_source(out, "untracked.yaml")
    assert main(["leaderboard", "verify", str(out), honest.stem]) == 2
    err = _one_line(capsys)
    assert f"untracked.yaml, is {(repo / 'untracked.yaml').resolve()}, which git does not track" in err, err
    _with_source(out, "smoke.yaml")
    assert main(["leaderboard", "verify", str(out), honest.stem]) == 0
