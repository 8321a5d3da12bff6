"""A run's output folder: one run at a time in it, and a full or read-only disk reported, not crashed on."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clbench.cli.main import main
from clbench.lease import Lease
from clbench.engine.outputs import RESULT, RUN_LOCK
from helpers import REPO, tiny_config


def _config(tmp_path: Path, **overrides) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tiny_config(**overrides), sort_keys=False))
    return path


def _one_error_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("clbench: error: "), text
    assert "Traceback" not in text
    return lines[0]


def test_two_simultaneous_runs_into_one_folder_one_succeeds_the_other_is_refused(tmp_path):
    config, out = _config(tmp_path), tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-m", "clbench.cli.main", "run", "-c", str(config), "-o", str(out),
                               "--no-progress", f"seed={seed}"], cwd=tmp_path, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for seed in (1, 2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 2], outputs
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    line = _one_error_line(outputs[loser][1])
    # Refused by the lock while the other ran, or (on a slow machine) by the finished result it left.
    assert "is in use by another clbench run" in line or "already holds a finished run" in line, line
    assert "wrote" not in outputs[loser][0]
    result = json.loads((out / RESULT).read_text())
    assert result["config"]["seed"] == (1, 2)[winner]  # the successful run's result, not overwritten
    assert sorted(p.name for p in out.iterdir()) == ["model", RESULT]  # its lock is gone, nothing else left


def test_a_held_folder_is_refused_naming_the_holder_and_left_unchanged(tmp_path, capsys):
    config, out = _config(tmp_path), tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    holder = Lease(out / RUN_LOCK)
    assert holder.try_acquire()
    try:
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        assert main(["run", "-c", str(config), "-o", str(out), "--no-progress"]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert f"{out} is in use by another clbench run (pid {os.getpid()} on " in line
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    finally:
        holder.release()
    fresh = tmp_path / "fresh"
    holder = Lease(fresh / RUN_LOCK)  # a folder the refused run would have created is not left behind either
    assert holder.try_acquire()
    try:
        assert main(["run", "-c", str(config), "-o", str(fresh / "sub"), "--no-progress"]) == 0
        assert main(["run", "-c", str(config), "-o", str(fresh), "--no-progress"]) == 2
        assert sorted(p.name for p in fresh.iterdir()) == [RUN_LOCK, "sub"]
    finally:
        holder.release()


HOLD_AND_DIE = '''
import os, signal, sys
from clbench.lease import Lease
lock = Lease(sys.argv[1])
assert lock.try_acquire()
os.kill(os.getpid(), signal.SIGKILL)
'''


def test_a_killed_runs_lock_does_not_keep_the_folder(tmp_path, capsys):
    config, out = _config(tmp_path), tmp_path / "out"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", HOLD_AND_DIE, str(out / RUN_LOCK)], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert dead.returncode == -signal.SIGKILL and (out / RUN_LOCK).is_file()
    assert main(["run", "-c", str(config), "-o", str(out), "--no-progress"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["model", RESULT]


# -- full and read-only disks -----------------------------------------------------------------

def _mount_tmpfs(folder: Path, size: str) -> bool:
    """A small tmpfs at ``folder`` (root with mount rights only); False where it cannot be had."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _unmount(folder: Path) -> None:
    subprocess.run(["umount", str(folder)], capture_output=True, timeout=30)


def _free_bytes(folder: Path) -> int:
    stats = os.statvfs(folder)
    return stats.f_bavail * stats.f_frsize


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Path, list, int]:
    """The config, its uninterrupted R, and the size of its checkpoint after one experience."""
    from clbench.config.load import load_config
    from clbench.engine.outputs import CHECKPOINT
    from helpers import crash_at

    root = tmp_path_factory.mktemp("disk")
    cfg_path = _config(root)
    assert main(["run", "-c", str(cfg_path), "-o", str(root / "whole"), "--no-progress", "--threads", "1"]) == 0
    reference = json.loads((root / "whole" / RESULT).read_text())["r_matrix"]
    with pytest.MonkeyPatch.context() as monkeypatch:
        crash_at(monkeypatch, "stage:1:step:0", load_config(cfg_path), root / "one")
    return cfg_path, reference, (root / "one" / CHECKPOINT).stat().st_size


@pytest.mark.parametrize("disk", ["tmpfs", "simulated"])
def test_a_full_disk_stops_the_run_with_one_line_and_resume_gives_the_uninterrupted_r(tmp_path, monkeypatch,
                                                                                      capsys, disk, uninterrupted):
    from clbench import io
    from clbench.engine.outputs import CHECKPOINT

    cfg_path, reference, checkpoint_size = uninterrupted
    disk_dir = tmp_path / "disk"
    if disk == "tmpfs":
        if not _mount_tmpfs(disk_dir, "1m"):
            pytest.skip("cannot mount a tmpfs here (needs root with mount rights)")
        request_unmount = True
        # Room for the first checkpoint, not for the second beside it (an atomic write needs both).
        filler = disk_dir / "filler"
        filler.write_bytes(b"\0" * max(0, _free_bytes(disk_dir) - int(1.5 * checkpoint_size)))
    else:  # the same failure, raised by the file's write() inside torch.save once one checkpoint exists
        request_unmount = False
        filler = None
        real_fdopen = os.fdopen

        class FullDisk:
            def __init__(self, handle):
                self.handle = handle

            def write(self, data):
                if (out / CHECKPOINT).exists():
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return self.handle.write(data)

            def __getattr__(self, name):
                return getattr(self.handle, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.handle.close()

        monkeypatch.setattr(io.os, "fdopen", lambda *a, **kw: FullDisk(real_fdopen(*a, **kw)))
    out = disk_dir / "out"
    capsys.readouterr()
    try:
        assert main(["run", "-c", str(cfg_path), "-o", str(out), "--no-progress", "--threads", "1"]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert f"cannot write {out / CHECKPOINT}: No space left on device" in line and "--resume" in line, line
        assert (out / CHECKPOINT).is_file() and not (out / RESULT).exists()
        assert not list(out.glob(".*.tmp"))  # no half-written temporary left to fill the disk further
        if filler is not None:
            filler.unlink()  # space freed
        else:
            monkeypatch.setattr(io.os, "fdopen", real_fdopen)
        assert main(["run", "-c", str(cfg_path), "-o", str(out), "--no-progress", "--threads", "1", "--resume"]) == 0
        assert json.loads((out / RESULT).read_text())["r_matrix"] == reference
    finally:
        if request_unmount:
            _unmount(disk_dir)


def test_a_disk_error_outside_the_write_helpers_is_one_line_naming_its_path(tmp_path, monkeypatch, capsys):
    """A write that does not go through clbench.io (a logger's file, a folder) is caught at the
    command's boundary; a permission error there may come from a read, so it says 'access'."""
    import clbench.leaderboard.render as render

    for code, expected in ((errno.ENOSPC, f"cannot write {tmp_path / 'events'}: No space left on device (free "
                                          "space (or quota) on that filesystem and run the command again)"),
                           (errno.EACCES, f"cannot access {tmp_path / 'events'}: Permission denied (give this "
                                          "user access to it, or choose another path)")):
        def failing(root, code=code):
            raise OSError(code, os.strerror(code), str(tmp_path / "events"))

        monkeypatch.setattr(render, "render", failing)
        assert main(["leaderboard", "render", str(tmp_path)]) == 2
        assert capsys.readouterr().err.splitlines() == [f"clbench: error: {expected}"]


def test_a_full_disk_error_without_a_file_name_names_the_runs_folder(tmp_path, monkeypatch, capsys):
    """ENOSPC from a write() or close() holds no file name: the run's folder is named instead of 'a file'."""
    import clbench.engine.saved as saved

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(saved, "save_after", full)
    config = _config(tmp_path)
    out = tmp_path / "out"
    assert main(["run", "--config", str(config), "--output", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"clbench: error: cannot write a file while writing into {out}: No space left on device (free space "
        "(or quota) on that filesystem and run the command again)"]
