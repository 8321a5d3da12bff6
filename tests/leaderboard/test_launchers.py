"""``leaderboard run --launcher local|slurm|submitit-local``: the grid spread over processes or cluster jobs.

Every launcher must give the serial run's entries (same R matrices, same scores), never run a
cell twice, and record a cell whose process died as failed, saying why.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from clbench.cli.main import main
from clbench.leaderboard import entries as E
from clbench.leaderboard.cell import RUNS_DIR
from clbench.leaderboard.execute import run_suite
from clbench.leaderboard.launch import LOGS_DIR, run_local
from clbench.leaderboard.suite import load_suite
from helpers import REPO, SMOKE, default_sigint, smoke, write_suite


# Dies like an out-of-memory kill in its second experience, after the first one's checkpoint.
CRASH = '''
import os
import signal

from clbench.strategy import Strategy


class Crash(Strategy):
    def before_experience(self, ctx, experience):
        if experience.position == 1:
            os.kill(os.getpid(), signal.SIGKILL)
'''




def crash_strategy(folder: Path) -> dict:
    path = folder / "crash.py"
    path.write_text(CRASH)
    return {"class_path": f"{path}:Crash"}


def cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["leaderboard", "run", "--no-render", "--no-progress", *args])
    return code, out.getvalue()


@pytest.fixture(scope="module")
def serial(tmp_path_factory) -> dict[str, dict]:
    """The smoke suite run one cell after another in this process: the reference entries, by hash."""
    out = tmp_path_factory.mktemp("serial") / "lb"
    run_suite(load_suite(SMOKE), out, console=Console(file=io.StringIO()))
    return {e.config_hash: e.document for e in E.load_entries(out)}


def assert_same_as_serial(out: Path, serial: dict, hashes) -> None:
    for digest in hashes:
        entry = E.read_entry(E.entry_path(out, digest))
        assert entry["status"] == "ok", entry.get("error")
        assert entry["r_matrix"] == serial[digest]["r_matrix"]
        assert entry["scores"] == serial[digest]["scores"]
        assert entry["execution"]["torch_threads"] == 1


@pytest.mark.slow
def test_local_jobs_give_the_serial_entries_and_a_dead_worker_fails_only_its_cell(tmp_path, serial):
    data = smoke(strategies=["naive", "joint", crash_strategy(tmp_path)], orders=["default"])
    suite = load_suite(write_suite(tmp_path, data))
    out = tmp_path / "lb"
    code, text = cli("--suite", str(suite.path), "--output", str(out), "--launcher", "local", "--jobs", "2")
    assert code == 0, text
    assert "2 ran, 1 failed, 0 already done" in text
    crash = next(r.hash for r in suite.runs if r.strategy.endswith(":Crash"))
    assert_same_as_serial(out, serial, [r.hash for r in suite.runs if r.hash != crash])
    failed = E.read_entry(E.entry_path(out, crash))
    assert failed["status"] == "failed" and failed["error"] == "worker process killed by SIGKILL (out of memory?)"
    assert (out / RUNS_DIR / crash / "checkpoint.pt").is_file()  # --retry-failed resumes it
    assert not (out / RUNS_DIR / f"{crash}.lock").exists()
    assert [p.name for p in (out / LOGS_DIR).iterdir()] == [f"{crash}.log"]  # only the failed cell's log stays


@pytest.mark.slow
def test_an_interrupted_local_launcher_reruns_only_the_missing_cells(tmp_path, serial):
    suite = load_suite(write_suite(tmp_path, smoke(strategies=["naive"])))  # two cells: the two orders
    out = tmp_path / "lb"
    command = [sys.executable, "-m", "clbench.cli.main", "leaderboard", "run", "--no-render", "--suite", str(suite.path), "--output",
               str(out), "--no-progress", "--launcher", "local", "--jobs", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 240
        while not list((out / "entries").glob("*.json")):
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "no cell finished"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        text = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, text[-3000:]
    assert "interrupted after" in text and "rerun the same command to continue" in text
    first = {e.config_hash for e in E.load_entries(out)}
    assert first and all(e.status == "ok" for e in E.load_entries(out))  # the interrupted cell is not "failed"
    assert not list(out.glob(f"{RUNS_DIR}/*.lock"))  # the interrupted worker let go of its cell

    outcome = run_local(suite, out, jobs=2, console=Console(file=io.StringIO()))
    missing = [r.hash for r in suite.runs if r.hash not in first]
    assert sorted(outcome.ran + outcome.resumed) == sorted(missing)
    assert sorted(outcome.skipped) == sorted(first) and not outcome.failed
    assert_same_as_serial(out, serial, [r.hash for r in suite.runs])
    assert not (out / RUNS_DIR).exists() and not (out / LOGS_DIR).exists()


@pytest.mark.slow
def test_the_submitit_path_runs_end_to_end_with_the_local_executor(tmp_path, serial):
    data = smoke(strategies=["naive", crash_strategy(tmp_path)], orders=["default"])
    suite = load_suite(write_suite(tmp_path, data))
    out = tmp_path / "lb"
    code, text = cli("--suite", str(suite.path), "--output", str(out), "--launcher", "submitit-local")
    assert code == 0, text
    assert "submitted 2 cells as jobs" in text and "1 ran, 1 failed" in text
    naive, crash = (r.hash for r in suite.runs)
    assert_same_as_serial(out, serial, [naive])
    failed = E.read_entry(E.entry_path(out, crash))
    assert failed["status"] == "failed" and "without writing its entry" in failed["error"]
    assert not (out / "slurm" / "cells").exists()  # every job settled

    code, text = cli("--suite", str(suite.path), "--output", str(out), "--launcher", "submitit-local")
    assert code == 0 and "2 already done" in text and "cells as jobs" not in text


def test_local_workers_get_one_gpu_each_round_robin_and_the_suites_threads(tmp_path, monkeypatch):
    from clbench.leaderboard import launch
    from clbench.leaderboard.cell import SuiteOutcome

    started = []

    class Popen:
        def __init__(self, command, **kw):
            started.append((command, kw["env"]))

    monkeypatch.setattr(launch, "_gpu_ids", lambda: ["3", "5"])
    monkeypatch.setattr(launch.subprocess, "Popen", Popen)
    suite = load_suite(SMOKE)
    pool = launch._Local(suite, tmp_path, SuiteOutcome(total=4), Console(file=io.StringIO()), jobs=3, force=False,
                         seen={suite.runs[1].hash: "c" * 64})
    pool.status = launch.CellStatus(pool.console, 4, progress=False)
    for spec in suite.runs[:3]:
        pool._start(spec, tmp_path)
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env in started] == ["3", "5", "3"]
    assert all(env["OMP_NUM_THREADS"] == "1" for _, env in started)
    assert [w.slot for w in pool.running] == [0, 1, 2]
    command = started[1][0]
    assert command[command.index("--hash") + 1] == suite.runs[1].hash and "c" * 64 in command  # the entry it saw
    assert launch.default_jobs(suite) == 2  # one worker per GPU


@pytest.mark.skipif(not (REPO / "leaderboard" / "entries").is_dir(), reason="no committed leaderboard/")
def test_a_cell_whose_entry_another_process_wrote_is_not_run_again(tmp_path, monkeypatch):
    """``run_cell`` (what every worker and job runs) skips a cell whose entry changed since the launcher looked."""
    import shutil

    import clbench.engine.runner
    from clbench.leaderboard.cell import run_cell

    suite = load_suite(REPO / "configs" / "suites" / "quickstart.yaml")
    digest = suite.runs[0].hash
    out = tmp_path / "lb"
    (out / "entries").mkdir(parents=True)
    shutil.copy(E.entry_path(REPO / "leaderboard", digest), E.entry_path(out, digest))
    monkeypatch.setattr(clbench.engine.runner, "run", lambda *a, **k: pytest.fail("ran a finished cell"))
    summary = run_cell(suite.path, out, digest, seen=None, console=Console(file=io.StringIO()))
    assert summary == {"hash": digest, "status": "elsewhere", "note": "finished by another process"}
    assert not (out / RUNS_DIR).exists()


FAKE_SBATCH = '''#!/bin/sh
n=$(ls "$FAKE_SLURM"/sbatch-* 2>/dev/null | wc -l)
id=$((4242 + n))
cp "$1" "$FAKE_SLURM/sbatch-$id.sh"
echo "Submitted batch job $id"
'''
FAKE_SACCT = '''#!/bin/sh
echo "JobID|State|NodeList"
cat "$FAKE_SLURM/states" 2>/dev/null
'''


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """srun, sbatch and sacct stand-ins on PATH: sbatch keeps each script and answers job ids 4242, 4243, ..."""
    import submitit

    bin_dir, record = tmp_path / "bin", tmp_path / "fake-slurm"
    bin_dir.mkdir()
    record.mkdir()
    for name, text in (("srun", "#!/bin/sh\nexit 0\n"), ("sbatch", FAKE_SBATCH), ("sacct", FAKE_SACCT)):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(record))
    submitit.SlurmJob.watcher.clear()
    return record


def test_the_sbatch_script_carries_the_suite_and_command_line_options(tmp_path, fake_slurm):
    slurm = {"partition": "cpu", "timeout_min": 30, "cpus_per_task": 2, "additional": {"account": "proj"},
             "setup": ["module load cuda"]}
    suite = load_suite(write_suite(tmp_path, smoke(launcher={"slurm": slurm})))
    assert [r.hash for r in suite.runs] == [r.hash for r in load_suite(SMOKE).runs]  # not part of any hash
    out = tmp_path / "lb"
    code, text = cli("--suite", str(suite.path), "--output", str(out), "--launcher", "slurm", "--no-wait",
                     "--partition", "gpu", "--gpus-per-job", "1", "--time-min", "45", "--jobs", "2",
                     "--slurm-option", "qos=high", "--slurm-option", "account=other")
    assert code == 0, text
    assert "submitted 4 cells as jobs 4242_0, 4242_1, 4242_2, 4242_3" in text and "4 still queued or running" in text
    script = (fake_slurm / "sbatch-4242.sh").read_text()
    for line in ("#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=1", "#SBATCH --time=45",
                 "#SBATCH --array=0-3%2", "#SBATCH --cpus-per-task=2", "#SBATCH --qos=high",
                 "#SBATCH --account=other", "#SBATCH --job-name=clbench-smoke", "module load cuda",
                 "export OMP_NUM_THREADS=1", f"#SBATCH --output={out / 'slurm'}/%A_%a_0_log.out"):
        assert line in script.splitlines(), line
    assert "partition=cpu" not in script and "account=proj" not in script  # the command line wins
    assert len(list((out / "slurm" / "cells").glob("*.json"))) == 4

    # later: three jobs still queued or running, one timed out without an entry
    runs = load_suite(SMOKE).runs
    (fake_slurm / "states").write_text("4242_0|PENDING|\n4242_1|RUNNING|n1\n4242_2|PENDING|\n4242_3|TIMEOUT|n2\n")
    (out / "slurm" / "4242_3_0_log.err").write_text("slurmstepd: error: *** JOB 4245 CANCELLED DUE TO TIME LIMIT ***\n")
    code, text = cli("--suite", str(suite.path), "--output", str(out), "--launcher", "slurm", "--no-wait")
    assert code == 0, text
    assert "3 cells are still queued or running in earlier jobs" in text and "cells as jobs" not in text
    assert "0 ran, 1 failed, 0 already done, 3 still queued or running" in text
    failed = E.read_entry(E.entry_path(out, runs[3].hash))
    assert failed["status"] == "failed"
    assert failed["error"] == ("job 4242_3 ended (TIMEOUT) without writing its entry: "
                               "slurmstepd: error: *** JOB 4245 CANCELLED DUE TO TIME LIMIT ***")
    assert len(list(fake_slurm.glob("sbatch-*"))) == 1

    # --retry-failed resubmits that cell alone (one job, not an array)
    code, text = cli("--suite", str(suite.path), "--output", str(out), "--launcher", "slurm", "--no-wait",
                     "--retry-failed")
    assert code == 0, text
    assert "submitted 1 cells as jobs 4243" in text
    script = (fake_slurm / "sbatch-4243.sh").read_text()
    assert "#SBATCH --array" not in script and "#SBATCH --partition=cpu" in script and "#SBATCH --time=30" in script
    assert (out / "slurm" / "cells" / f"{runs[3].hash}.json").read_text().count('"4243"') == 1


@pytest.mark.parametrize("args, message", [
    (["--launcher", "local", "--jobs", "0"], "--jobs: expected at least 1, got 0"),
    (["--jobs", "2"], "--jobs: the serial launcher runs one grid point at a time (add --launcher local"),
    (["--launcher", "slurm", "--slurm-option", "account"], "--slurm-option: expected KEY=VALUE, got 'account'"),
    (["--launcher", "local", "--partition", "gpu"], "--partition: --partition applies to the slurm launcher only"),
    (["--launcher", "local", "--no-wait"], "--no-wait: --no-wait applies to the slurm launcher only"),
    (["--launcher", "slurm", "--time-min", "0"], "--time-min: expected at least 1, got 0"),
])
def test_bad_launcher_options_are_one_line_errors(tmp_path, capsys, args, message):
    assert main(["leaderboard", "run", "--no-render", "--suite", str(SMOKE), "--output", str(tmp_path / "lb"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "lb").exists()


@pytest.mark.parametrize("launcher, where, fix", [
    ({"slurm": {"partiton": "gpu"}}, "launcher.slurm.partiton: unknown key 'partiton'", "did you mean 'partition'?"),
    ({"slrum": {}}, "launcher.slrum: unknown key 'slrum'", "did you mean 'slurm'?"),
    ({"local": {"jobs": 0}}, "launcher.local.jobs: must be >= 1, got 0", "int >= 1"),
    ({"slurm": {"additional": ["x"]}}, "launcher.slurm.additional: expected mapping", ""),
])
def test_bad_launcher_sections_are_one_line_errors(tmp_path, capsys, launcher, where, fix):
    path = write_suite(tmp_path, smoke(launcher=launcher))
    assert main(["leaderboard", "run", "--no-render", "--suite", str(path), "--output", str(tmp_path / "lb")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: {where}" in err and fix in err, err


def test_slurm_without_slurm_is_a_user_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun
    assert main(["leaderboard", "run", "--no-render", "--suite", str(SMOKE), "--output", str(tmp_path / "lb"),
                 "--launcher", "slurm"]) == 2
    assert "no SLURM here (srun is not on PATH)" in capsys.readouterr().err


def test_a_worker_whose_launcher_died_while_it_was_starting_stops_at_once(tmp_path):
    """The launcher passes its pid: a worker that finds another parent when it starts to watch
    (its launcher was killed during the worker's imports) interrupts itself straight away, even
    started with SIGINT ignored as ``nohup ... &`` starts it."""
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a launcher pid that is no parent of the worker any more
    child = ("import time; from clbench.leaderboard.worker import watch_parent\n"
             f"try:\n    watch_parent(0.05, parent={gone.pid})\n    time.sleep(60)\n"
             "except KeyboardInterrupt:\n    print('interrupted')\n")
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert done.stdout.strip() == "interrupted", done.stderr


def test_a_worker_whose_launcher_was_killed_stops_as_if_interrupted(tmp_path):
    """A launcher killed with SIGKILL cannot stop its workers (each in a session of its own):
    the worker sees its parent gone and interrupts itself (its cell's checkpoint kept). The
    launcher here ignores SIGINT, as one started with ``nohup ... &`` does, and its worker
    inherits that."""
    import subprocess
    import sys
    import time

    marker, watching = tmp_path / "interrupted", tmp_path / "watching"
    child = (f"import time; from clbench.leaderboard.worker import watch_parent; watch_parent(0.05)\n"
             f"open({str(watching)!r}, 'w').close()\n"
             f"try:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    open({str(marker)!r}, 'w').write('yes')\n")
    parent = (f"import signal, subprocess, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
              f"p = subprocess.Popen([sys.executable, '-c', {child!r}], "
              f"start_new_session=True); print(p.pid, flush=True); time.sleep(60)")
    launcher = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    worker = int(launcher.stdout.readline())
    deadline = time.monotonic() + 50
    while not watching.exists() and time.monotonic() < deadline:  # imported clbench and watching, however busy
        time.sleep(0.05)
    assert watching.exists()
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 20
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.read_text() == "yes"
    for _ in range(100):  # and it has exited
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(worker, signal.SIGKILL)
        raise AssertionError("the worker outlived its launcher")


def test_a_worker_that_cannot_write_its_report_ends_with_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    """The report is the worker's last write: a full disk there is bad input like any other (one
    ``clbench: error:`` line naming the file, exit 2, which the launcher records), not a traceback."""
    import errno

    import clbench.io
    from clbench.leaderboard import cell, worker

    def full(path, obj):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(worker, "watch_parent", lambda parent=None: None)  # no watch thread left in pytest
    monkeypatch.setattr(cell, "run_cell", lambda *args, **kwargs: {"status": "ok"})
    monkeypatch.setattr(clbench.io, "write_json", full)
    report = tmp_path / "report.json"
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        assert worker.main(["--suite", str(SMOKE), "--output", str(tmp_path / "lb"), "--hash", "0" * 16,
                            "--report", str(report)]) == 2
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    assert capsys.readouterr().err.splitlines() == [
        f"clbench: error: cannot write {report}: No space left on device (free space (or quota) on that "
        "filesystem and run the command again)"]
