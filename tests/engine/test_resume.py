"""Crash and resume: a run SIGKILLed anywhere and resumed gives the uninterrupted result exactly.

Real ``clbench run`` processes are killed with SIGKILL (no cleanup runs, as with an OOM kill
or preemption) at the points ``CLBENCH_TEST_KILL_AT`` names (:mod:`clbench.engine.faults`): in the
middle of an experience's training, during its evaluation, halfway through writing a
checkpoint and halfway through writing ``result.json``. Each is resumed with ``--resume`` and
compared with an uninterrupted run: R matrix, per-epoch matrices, scores and the TensorBoard
training curve must be identical, not close.

The model uses dropout and the strategy is replay, so the result depends on the global torch
generator, the trainer's epoch counter and the strategy's memory: restoring any of them wrongly
changes the numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import yaml

from helpers import REPO, crash_at, default_sigint, kill_env, tiny_config

CONFIG = tiny_config(model={"class_path": "mlp", "init_args": {"hidden": 32, "dropout": 0.25}},
                     strategy={"class_path": "replay", "init_args": {"mem_size": 60}},
                     train={"epochs": 2, "batch_size": 32, "eval_every_epoch": True},
                     logging={"progress": False, "tensorboard": True})

# kill point -> experiences complete in the checkpoint the kill leaves behind
KILL_POINTS = {
    "stage:1:step:5": 1,        # early in the second experience
    "stage:2:step:50": 2,       # in the second epoch of the third experience
    "stage:1:eval": 1,          # evaluating after the second experience's first epoch
    "stage:1:checkpoint": 1,    # writing the second checkpoint: the first must survive intact
    "result": 3,                # writing result.json: everything is done but the result
}
FIRST_EXPERIENCE = "stage:0:step:60"  # in its second epoch: the first one is logged


def _cli(args: list[str], kill_at: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clbench.cli.main", *args], cwd=REPO, env=kill_env(kill_at),
                          capture_output=True, text=True, timeout=300)


def _listing(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir()) if out.exists() else []


def _scalars(out: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


# kill points a test needs beyond its own ``point`` parameter
_POINTS_OF = {"test_a_kill_while_writing_leaves_the_previous_file_whole": ["stage:1:checkpoint", "result"],
              "test_killed_in_the_first_experience_there_is_nothing_to_resume": [FIRST_EXPERIENCE]}


def _selected(request) -> tuple[set[str], bool]:
    """The kill points the selected tests of this module use, and whether any uses the reference."""
    points, reference = set(), False
    for item in request.session.items:
        if item.module is not request.module:
            continue
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "point" in callspec.params:
            points.add(callspec.params["point"])
        points.update(_POINTS_OF.get(item.originalname, []))
        reference = reference or "reference" in item.fixturenames
    return points, reference


class _AsTheyFinish:
    """One field of the runs, by kill point: reading a point waits for that point's runs only."""

    def __init__(self, futures: dict, field: str):
        self.futures, self.field = futures, field

    def __getitem__(self, name: str):
        return self.futures[name].result()[self.field]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, request):
    """The reference run, and each kill point the selected tests use killed and then resumed
    (and, for the first-experience kill, rerun from scratch). They run side by side in the
    background from the first test on; each test waits only for the runs it reads, so its time
    limit covers its own runs, and selecting one test runs only what it reads."""
    root = tmp_path_factory.mktemp("resume")
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    points, with_reference = _selected(request)
    outs = {name: root / name.replace(":", "_") for name in [*KILL_POINTS, FIRST_EXPERIENCE] if name in points}

    def cli(out: Path, *extra: str, kill_at: str | None = None):
        return _cli(["run", "--config", str(config), "--output", str(out), "--no-progress", *extra], kill_at)

    def kill_and_resume(name: str) -> dict:
        out = outs[name]
        killed = cli(out, kill_at=name)
        ckpt = out / "checkpoint.pt"
        after_kill = {"listing": _listing(out),
                      "checkpoint": torch.load(ckpt, map_location="cpu", weights_only=True) if ckpt.exists() else None}
        resumed = cli(out, "--resume")
        rerun = cli(out) if name == FIRST_EXPERIENCE else None
        return {"killed": killed, "after_kill": after_kill, "resumed": resumed, "rerun": rerun}

    pool = ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2)))
    futures = {"reference": pool.submit(lambda: {"killed": cli(root / "reference")})} if with_reference else {}
    futures.update({name: pool.submit(kill_and_resume, name) for name in outs})
    yield {"root": root, "config": config, "outs": outs,
           **{field: _AsTheyFinish(futures, field) for field in ("killed", "after_kill", "resumed", "rerun")}}
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def reference(runs) -> dict:
    proc = runs["killed"]["reference"]
    assert proc.returncode == 0, proc.stderr
    return json.loads((runs["root"] / "reference" / "result.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_killed_run_resumes_to_the_uninterrupted_result(point, runs, reference):
    killed = runs["killed"][point]
    assert killed.returncode == -9, f"the run was not killed at {point}:\n{killed.stderr}"
    assert "result.json" not in runs["after_kill"][point]["listing"]

    resumed = runs["resumed"][point]
    assert resumed.returncode == 0, resumed.stderr
    out = runs["outs"][point]
    result = json.loads((out / "result.json").read_text())
    assert result["r_matrix"] == reference["r_matrix"]
    assert result["r_init"] == reference["r_init"]
    assert result["r_epochs"] == reference["r_epochs"] and result["epoch_stage"] == reference["epoch_stage"]
    assert result["matrices"] == reference["matrices"]
    assert result["scores"] == reference["scores"]
    assert result["epoch_scores"] == reference["epoch_scores"]
    assert result["config_hash"] == reference["config_hash"]
    assert result["compute"]["resumes"] == 1 and reference["compute"]["resumes"] == 0
    # finished cleanly: no checkpoint, no half-written temporaries
    assert _listing(out) == ["model", "result.json", "tensorboard"]
    # the training curve reads as one run: the killed process's events after the checkpoint are purged
    assert _scalars(out, "train/loss") == _scalars(runs["root"] / "reference", "train/loss")


@pytest.mark.slow
@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_checkpoint_left_by_a_kill_is_complete_and_loads_weights_only(point, runs):
    ckpt = runs["after_kill"][point]["checkpoint"]
    assert ckpt is not None, f"no checkpoint after a kill at {point}"
    done = KILL_POINTS[point]
    assert ckpt["state"]["stage"] == done and len(ckpt["state"]["rows"]) == done
    assert json.loads(ckpt["config_json"])["strategy"] == {"class_path": "replay", "init_args": {"mem_size": 60}}
    assert set(ckpt["rng"]) == {"python", "numpy", "torch", "cuda"}
    assert isinstance(ckpt["rng"]["torch"], torch.Tensor)
    assert ckpt["epoch"] == 2 * done  # two epochs per experience
    assert len(ckpt["strategy"]["buffer"]) == 60  # the replay memory after the first experience on
    assert set(ckpt["model"]) == {"1.weight", "1.bias", "4.weight", "4.bias", "7.weight", "7.bias"}


@pytest.mark.slow
def test_a_kill_while_writing_leaves_the_previous_file_whole(runs):
    listing = runs["after_kill"]["stage:1:checkpoint"]["listing"]
    assert "checkpoint.pt" in listing
    assert any(name.startswith(".checkpoint.pt.") and name.endswith(".tmp") for name in listing), listing
    listing = runs["after_kill"]["result"]["listing"]
    assert "result.json" not in listing
    assert any(name.startswith(".result.json.") and name.endswith(".tmp") for name in listing), listing


@pytest.mark.slow
def test_killed_in_the_first_experience_there_is_nothing_to_resume(runs, reference):
    assert runs["killed"][FIRST_EXPERIENCE].returncode == -9
    assert runs["after_kill"][FIRST_EXPERIENCE]["checkpoint"] is None
    refused = runs["resumed"][FIRST_EXPERIENCE]
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [refused.stderr.strip()]
    assert refused.stderr.startswith("clbench: error: --resume: no checkpoint to resume in ")
    assert "Traceback" not in refused.stderr
    rerun = runs["rerun"][FIRST_EXPERIENCE]
    assert rerun.returncode == 0, rerun.stderr
    result = json.loads((runs["outs"][FIRST_EXPERIENCE] / "result.json").read_text())
    assert result["r_matrix"] == reference["r_matrix"]
    # the plain rerun replaced the killed run's TensorBoard events instead of mixing them in
    assert _scalars(runs["outs"][FIRST_EXPERIENCE], "train/loss") == _scalars(runs["root"] / "reference",
                                                                               "train/loss")


@pytest.mark.slow
def test_an_interrupted_leaderboard_run_completes_with_every_entry_once(tmp_path):
    """Kill a suite mid-experience, between two runs and while a result is written; rerun each time."""
    from clbench.leaderboard.entries import load_entries, read_entry
    from clbench.leaderboard.suite import load_suite

    base = tiny_config()
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "interrupted", "benchmarks": [base["benchmark"]], "models": [base["model"]],
        "strategies": ["naive", {"class_path": "replay", "init_args": {"mem_size": 60}}],
        "orders": ["default"], "seeds": [0], "base": {"train": base["train"], "logging": base["logging"]},
    }, sort_keys=False))
    board = tmp_path / "board"
    first, second = [r.hash for r in load_suite(suite).runs]

    def suite_run(kill_at: str | None):
        return _cli(["leaderboard", "run", "--no-render", "--suite", str(suite), "--output", str(board), "--no-progress"], kill_at)

    def entries() -> list[str]:
        folder = board / "entries"
        return sorted(p.name for p in folder.iterdir()) if folder.exists() else []

    # 1. killed in the middle of the first run's second experience: no entry, a checkpoint
    assert suite_run("stage:1:step:3").returncode == -9
    assert entries() == [] and (board / "runs" / first / "checkpoint.pt").is_file()
    # 2. the first run resumes and finishes; killed as soon as the second one trains
    proc = suite_run("stage:0:step:0")
    assert proc.returncode == -9
    assert "(resumed)" in proc.stdout
    assert entries() == [f"{first}.json"]
    # 3. the second run starts over and is killed while writing its result.json
    assert suite_run("result").returncode == -9
    assert entries() == [f"{first}.json"]
    assert not (board / "runs" / second / "result.json").exists()
    # 4. uninterrupted: the second run finishes from its last checkpoint
    done = suite_run(None)
    assert done.returncode == 0, done.stderr
    assert entries() == sorted([f"{first}.json", f"{second}.json"])
    loaded = load_entries(board)  # each one verifies: schema, content hash, file name = config hash
    assert [e.status for e in loaded] == ["ok", "ok"]
    for name in entries():
        entry = read_entry(board / "entries" / name)
        assert len(entry["r_matrix"]) == 3 and all(len(row) == 3 for row in entry["r_matrix"])
    assert not any(p.name.endswith(".tmp") for p in board.rglob("*"))


@pytest.mark.slow
def test_ctrl_c_exits_130_with_one_line_and_the_run_resumes(runs, reference):
    """SIGINT (Ctrl-C) while the second experience trains: exit 130, then --resume finishes it.

    The run sends itself the SIGINT at a fixed training step, so the test does not race the run."""
    out = runs["root"] / "interrupted-by-sigint"
    args = ["run", "--config", str(runs["config"]), "--output", str(out), "--no-progress"]
    env = kill_env("stage:1:step:3", signal="INT")
    proc = subprocess.run([sys.executable, "-m", "clbench.cli.main", *args], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=300, preexec_fn=default_sigint)
    stderr = proc.stderr
    assert proc.returncode == 130, stderr
    assert stderr.splitlines() == [stderr.strip()] and stderr.startswith("clbench: interrupted")
    assert not (out / "result.json").exists()
    assert torch.load(out / "checkpoint.pt", weights_only=True)["state"]["stage"] >= 1
    resumed = _cli([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "result.json").read_text())["r_matrix"] == reference["r_matrix"]


@pytest.mark.parametrize("strategy", [
    {"class_path": "ewc", "init_args": {"ewc_lambda": 50.0, "mode": "online", "gamma": 0.9}},
    {"class_path": "lwf", "init_args": {"alpha": 1.0}},
    {"class_path": "agem", "init_args": {"patterns_per_experience": 40, "sample_size": 32}},
    {"class_path": "cumulative"},
], ids=lambda s: s["class_path"])
def test_every_strategy_state_survives_a_crash(strategy, tmp_path, monkeypatch):
    """Fisher matrices, teacher weights, episodic memories: crashed in the third experience,
    resumed from the checkpoint after the second, the result is the uninterrupted one."""
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    cfg = resolve_config(tiny_config(strategy=strategy, train={"epochs": 2, "batch_size": 32}))
    reference = run(cfg, tmp_path / "reference")
    crash_at(monkeypatch, "stage:2:step:30", cfg, tmp_path / "crashed")
    assert torch.load(tmp_path / "crashed" / "checkpoint.pt", weights_only=True)["state"]["stage"] == 2
    resumed = run(cfg, tmp_path / "crashed", resume=True)
    assert resumed["r_matrix"] == reference["r_matrix"]
    assert resumed["scores"] == reference["scores"]


def test_a_strategy_state_that_cannot_be_checkpointed_is_refused_at_the_first_save(tmp_path):
    from clbench.config.load import resolve_config
    from clbench.errors import UserError
    from clbench.engine.runner import run

    plugin = tmp_path / "numpy_state.py"
    plugin.write_text(
        "import numpy as np\n"
        "from clbench.strategy import Strategy\n\n\n"
        "class NumpyState(Strategy):\n"
        "    def state_dict(self):\n"
        "        return {'memory': {'indices': np.arange(3)}}\n")
    cfg = resolve_config(tiny_config(strategy={"class_path": f"{plugin}:NumpyState"}))
    with pytest.raises(UserError, match=r"strategy: strategy state holds a value a checkpoint cannot store at "
                                        r"memory\.indices \(numpy\.ndarray\)"):
        run(cfg, tmp_path / "out")
    assert not (tmp_path / "out" / "checkpoint.pt").exists()


def test_a_resume_under_another_thread_count_is_refused_naming_both(tmp_path, monkeypatch, capsys):
    """The result records one thread count (CPU numbers depend on it): a resume under another
    is refused, one line naming both values and the fix, and the checkpoint is left as it was."""
    from clbench.cli.main import main
    from clbench.config.load import resolve_config

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(tiny_config(), sort_keys=False))
    out = tmp_path / "out"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        crash_at(monkeypatch, "stage:1:step:0", resolve_config(tiny_config()), out)
        before = (out / "checkpoint.pt").read_bytes()
        capsys.readouterr()
        assert main(["run", "-c", str(config), "-o", str(out), "--resume", "--threads", "2", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.splitlines() == [
            f"clbench: error: --threads: the run in {out} was started with 1 torch thread(s), this resume would use 2 "
            "(CPU results depend on the thread count) (resume with --threads 1, or start again with --overwrite)"]
        assert (out / "checkpoint.pt").read_bytes() == before and not (out / "result.json").exists()
        assert main(["run", "-c", str(config), "-o", str(out), "--resume", "--threads", "1", "--no-progress"]) == 0
        assert json.loads((out / "result.json").read_text())["env"]["torch_threads"] == 1
    finally:
        torch.set_num_threads(threads)
