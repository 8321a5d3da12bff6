"""Two ``clbench leaderboard run`` processes on one directory share the grid: one lock per grid point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from clbench.leaderboard import entries as E
from clbench.leaderboard.cell import RUNS_DIR
from clbench.leaderboard.lock import CellLock
from clbench.leaderboard.suite import load_suite
from helpers import REPO

# A strategy that, at the start of each run, leaves a marker naming its process and first
# experience, then waits for the test to open the gate: both processes are then provably
# inside the grid at the same time.
GATE = '''
import os
import time
from pathlib import Path

from clbench.strategy import Strategy


class Gate(Strategy):
    def __init__(self, folder: str):
        super().__init__()
        self.folder = folder

    def before_experience(self, ctx, experience):
        if experience.position != 0:
            return
        folder = Path(self.folder)
        (folder / f"started-{os.getpid()}-{experience.name}").write_text("")
        deadline = time.monotonic() + 300
        while not (folder / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
'''


def _gated_suite(tmp_path: Path) -> Path:
    gate = tmp_path / "gate.py"
    gate.write_text(textwrap.dedent(GATE))
    marks = tmp_path / "marks"
    marks.mkdir()
    suite = {"name": "gated",
             "benchmarks": [{"class_path": "digits-domains", "init_args": {"domains": ["rot0", "rot90"]}}],
             "models": [{"class_path": "mlp", "init_args": {"hidden": 16}}],
             "strategies": [{"class_path": f"{gate}:Gate", "init_args": {"folder": str(marks)}}],
             "orders": ["default", "reverse"], "seeds": [0], "threads": 1,
             "base": {"train": {"epochs": 1, "batch_size": 128}, "logging": {"tensorboard": False}}}
    path = tmp_path / "gated.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path


def test_two_processes_share_the_grid_and_run_each_point_once(tmp_path):
    suite_path = _gated_suite(tmp_path)
    marks = tmp_path / "marks"
    out = tmp_path / "lb"
    command = [sys.executable, "-m", "clbench.cli.main", "leaderboard", "run", "--no-render", "--suite", str(suite_path), "--output",
               str(out), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    procs = [subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    try:
        deadline = time.monotonic() + 300
        while len(list(marks.glob("started-*"))) < 2:
            for p in procs:
                assert p.poll() is None, p.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the two processes never both started a run"
            time.sleep(0.1)
        started = sorted(m.name for m in marks.glob("started-*"))
        pids = {name.split("-")[1] for name in started}
        assert pids == {str(p.pid) for p in procs}  # each process holds one grid point, at the same time
        assert sorted(name.split("-", 2)[2] for name in started) == ["rot0", "rot90"]  # two different points
        (marks / "go").write_text("")
        outputs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, text in zip(procs, outputs):
        assert p.returncode == 0, text[-3000:]
        assert "1 ran, 0 failed, 0 already done, 1 finished by another process" in text, text[-3000:]
        assert text.count("finished by another process") == 2  # its line for that grid point, and the summary
    # both tried the default order first: the one that found it locked said so and came back to it
    # (the other may have found its second point already finished and unlocked), naming the holder,
    # or "another process" if it looked between the lock's creation and the holder's note in it
    assert any(f"in progress in pid {p.pid} on " in text or "in progress in another process" in text
               for p, text in zip(procs, reversed(outputs)))
    assert len(list(marks.glob("started-*"))) == 2  # no grid point was started twice
    suite = load_suite(suite_path)
    assert sorted(e.config_hash for e in E.load_entries(out)) == sorted(r.hash for r in suite.runs)
    assert not (out / RUNS_DIR).exists()  # working folders and locks are gone


HOLD = '''
import os, signal, sys
from clbench.leaderboard.lock import CellLock
lock = CellLock(sys.argv[1], "a" * 64)
assert lock.try_acquire()
print("held", flush=True)
if sys.argv[2] == "die":
    os.kill(os.getpid(), signal.SIGKILL)
sys.stdin.read()
lock.release()
'''


def _holder(runs: Path, how: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(runs), how], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_live_holder_keeps_the_lock_and_a_dead_one_loses_it(tmp_path):
    runs = tmp_path / "runs"
    live = _holder(runs, "hold")
    try:
        lock = CellLock(runs, "a" * 64)
        assert not lock.try_acquire()
        assert lock.holder().startswith(f"pid {live.pid} on ")
        assert (runs / f"{'a' * 64}.lock").read_text().count(f"pid={live.pid}") == 1
    finally:
        live.communicate("")  # releases and exits
    assert live.returncode == 0 and not runs.exists()  # the lock file, then the empty folder, are gone

    dead = _holder(runs, "die")
    dead.wait()
    assert dead.returncode == -signal.SIGKILL
    assert (runs / f"{'a' * 64}.lock").is_file()  # a killed holder leaves its marker behind
    lock = CellLock(runs, "a" * 64)
    assert lock.try_acquire() or lock.try_acquire()  # same host, pid gone: stale, taken over
    lock.release()
    assert not runs.exists()


@pytest.mark.skipif(not hasattr(os, "O_EXCL"), reason="needs O_EXCL")
def test_lock_is_an_existence_marker_not_fcntl(tmp_path):
    """The lock must hold on a shared filesystem: it is the marker file itself, created exclusively."""
    lock = CellLock(tmp_path, "b" * 64)
    assert lock.try_acquire()
    try:
        marker = tmp_path / f"{'b' * 64}.lock"
        text = marker.read_text()
        assert f"pid={os.getpid()}" in text and "host=" in text and "duration=" in text
        with pytest.raises(FileExistsError):
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    finally:
        lock.release()
    assert not (tmp_path / f"{'b' * 64}.lock").exists()
