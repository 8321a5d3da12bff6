"""Suites, leaderboard entries and ``clbench leaderboard run``: skip what is done, rerun what is missing."""

from __future__ import annotations

import copy
import io
import json
import shutil
import signal
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from clbench.cli.main import main
from clbench.config.load import config_hash, deep_merge, resolve_config
from clbench.errors import NonFiniteLoss, UserError
from clbench.leaderboard import entries as E
from clbench.leaderboard.cell import RUNS_DIR
from clbench.leaderboard.execute import orders_first, run_suite
from clbench.leaderboard.suite import default_suite_path, load_suite, preflight
from clbench.leaderboard.table import build_tables
from helpers import SMOKE, kill_env, run_cli, smoke, write_suite

REPO = Path(__file__).resolve().parents[2]




def quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


def spy_runner(monkeypatch, fail_on=None):
    """Record the config hashes ``clbench.engine.runner.run`` is called with (and optionally fail)."""
    import clbench.engine.runner

    calls: list[tuple[str, bool]] = []
    real = clbench.engine.runner.run

    def spy(cfg, output=None, **kw):
        calls.append((config_hash(cfg), kw.get("resume", False)))
        if fail_on is not None:
            fail_on(cfg, len(calls))
        return real(cfg, output, **kw)

    monkeypatch.setattr(clbench.engine.runner, "run", spy)
    return calls


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    """The smoke suite run once through the CLI; returns (dir, stdout)."""
    out = tmp_path_factory.mktemp("board") / "lb"
    buf = io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(buf):
        code = main(["leaderboard", "run", "--suite", str(SMOKE), "--output", str(out), "--no-progress"])
    assert code == 0
    return out, buf.getvalue()


def copy_board(board, tmp_path) -> Path:
    dst = tmp_path / "lb"
    shutil.copytree(board[0], dst)
    return dst


def page_of(out: Path) -> dict[str, bytes]:
    """The rendered page's files, to check that a refused command left them as they were."""
    return {p.name: p.read_bytes() for p in (out / "README.md", out / "index.html")}


# -- suites -----------------------------------------------------------------------------------
def test_suite_expands_the_grid_into_resolved_configs():
    suite = load_suite(SMOKE)
    assert [(r.strategy, r.order) for r in suite.runs] == [("naive", "default"), ("naive", "reverse"),
                                                            ("joint", "default"), ("joint", "reverse")]
    raw = {"seed": 0, "benchmark": {"class_path": "digits-domains", "init_args": {"domains": ["rot0", "rot90"]}},
           "model": {"class_path": "mlp", "init_args": {"hidden": 32}}, "strategy": "joint", "order": "reverse",
           "train": {"epochs": 1, "batch_size": 64, "optimizer": {"class_path": "adam", "init_args": {"lr": 0.01}}},
           "logging": {"tensorboard": False}}
    same = resolve_config(raw)
    # a suite run is the run `clbench run` makes from the same config, but for the weights it keeps:
    # none, unless the suite sets save (outside the config hash)
    assert suite.runs[3].config == {**same, "save": {"final": False}}
    assert suite.runs[3].hash == config_hash(same)
    assert len({r.hash for r in suite.runs}) == 4


def test_benchmark_orders_override_the_suite_orders(tmp_path):
    data = smoke(benchmarks=[{"class_path": "digits-domains", "init_args": {"domains": ["rot0", "rot90"]},
                              "orders": [["rot90", "rot0"]]}])
    suite = load_suite(write_suite(tmp_path, data))
    assert [r.config["order"] for r in suite.runs] == [["rot90", "rot0"], ["rot90", "rot0"]]


def test_benchmark_strategies_replace_the_suite_strategies_for_that_benchmark(tmp_path):
    """A method for one scenario type only, or settings chosen per stream: a benchmark's own list."""
    domains = {"class_path": "digits-domains", "init_args": {"domains": ["rot0", "rot90"]}}
    own = {**domains, "init_args": {"domains": ["rot0", "invert"]},
           "strategies": ["naive", {"class_path": "ewc", "init_args": {"ewc_lambda": 3.0}}]}
    data = smoke(benchmarks=[domains, own], orders=["default"])
    suite = load_suite(write_suite(tmp_path, data))
    points = [(r.config["benchmark"]["init_args"]["domains"][1], r.strategy, r.config["strategy"]["init_args"])
              for r in suite.runs]
    assert points == [("rot90", "naive", {}), ("rot90", "joint", {}), ("invert", "naive", {}),
                      ("invert", "ewc", {"ewc_lambda": 3.0})]
    assert all("strategies" not in r.config["benchmark"] for r in suite.runs)
    own["strategies"][1]["init_args"]["ewc_lambda"] = -1.0  # checked before any run, as the suite's own are
    with pytest.raises(UserError, match=r"benchmarks\[1\]\.strategies\[1\]\.init_args\.ewc_lambda"):
        preflight(load_suite(write_suite(tmp_path, data)))
    del data["strategies"]  # then every benchmark needs its own
    own["strategies"][1]["init_args"]["ewc_lambda"] = 3.0
    with pytest.raises(UserError, match=r"benchmarks\[0\] \(digits-domains\) lists no strategies of its own"):
        load_suite(write_suite(tmp_path, data))
    data["benchmarks"][0] = {**domains, "strategies": ["naive"]}
    assert [r.strategy for r in load_suite(write_suite(tmp_path, data)).runs] == ["naive", "naive", "ewc"]


def test_benchmark_train_args_apply_to_its_points_under_a_strategys_own(tmp_path):
    """Epochs per stream (the same iterations on experiences of different sizes); a strategy's
    train_args still win for its points."""
    domains = {"class_path": "digits-domains", "init_args": {"domains": ["rot0", "rot90"]}}
    longer = {**domains, "init_args": {"domains": ["rot0", "invert"]}, "train_args": {"epochs": 5, "batch_size": 16}}
    data = smoke(benchmarks=[domains, longer], orders=["default"],
                 strategies=["naive", {"class_path": "joint", "train_args": {"epochs": 7}}])
    suite = load_suite(write_suite(tmp_path, data))
    base = data["base"]["train"]
    got = [(r.config["benchmark"]["init_args"]["domains"][1], r.strategy, r.config["train"]["epochs"],
            r.config["train"]["batch_size"]) for r in suite.runs]
    assert got == [("rot90", "naive", base["epochs"], base["batch_size"]), ("rot90", "joint", 7, base["batch_size"]),
                   ("invert", "naive", 5, 16), ("invert", "joint", 7, 16)]
    longer["train_args"] = {"epochs": 0}
    with pytest.raises(UserError, match=r"benchmarks\[1\]\.train_args"):
        load_suite(write_suite(tmp_path, data))


def test_a_strategys_model_args_apply_to_its_points_only(tmp_path):
    data = yaml.safe_load(SMOKE.read_text())
    data["strategies"] = ["naive", {"class_path": "replay", "init_args": {"mem_size": 50},
                                    "model_args": {"hidden": 8}}]
    suite = load_suite(write_suite(tmp_path, data))
    hidden = {r.strategy: r.config["model"]["init_args"].get("hidden") for r in suite.runs}
    base = yaml.safe_load(SMOKE.read_text())["models"][0]
    assert hidden == {"naive": (base.get("init_args") or {}).get("hidden"), "replay": 8}
    assert all("model_args" not in r.config["strategy"] for r in suite.runs)
    data["strategies"][1]["model_args"] = [8]
    with pytest.raises(UserError, match=r"strategies\[1\]\.model_args"):
        load_suite(write_suite(tmp_path, data))


def test_a_strategys_train_args_apply_to_its_points_only(tmp_path):
    data = yaml.safe_load(SMOKE.read_text())
    data.setdefault("base", {}).setdefault("train", {})["optimizer"] = {"class_path": "adamw", "init_args": {"lr": 3e-3}}
    data["strategies"] = ["naive", {"class_path": "replay", "init_args": {"mem_size": 50},
                                    "train_args": {"optimizer": {"init_args": {"lr": 1e-5}}}}]
    suite = load_suite(write_suite(tmp_path, data))
    lr = {r.strategy: r.config["train"]["optimizer"]["init_args"]["lr"] for r in suite.runs}
    assert lr == {"naive": 3e-3, "replay": 1e-5}
    # the rest of base.train is kept for both, and the override is in no strategy's arguments
    def without_lr(train: dict) -> dict:
        return {**train, "optimizer": {**train["optimizer"], "init_args": {}}}
    trains = {r.strategy: without_lr(r.config["train"]) for r in suite.runs}
    assert trains["naive"] == trains["replay"] and trains["naive"]["epochs"] == data["base"]["train"]["epochs"]
    assert all("train_args" not in r.config["strategy"] for r in suite.runs)
    data["strategies"][1]["train_args"] = {"epochs": -1}
    with pytest.raises(UserError, match=r"strategies\[1\]\.train_args.*epochs"):
        load_suite(write_suite(tmp_path, data))


def test_quickstart_is_the_default_suite():
    path = default_suite_path()
    assert Path(path).resolve() == (REPO / "configs" / "suites" / "quickstart.yaml").resolve()
    suite = load_suite(REPO / path)
    assert suite.name == "quickstart"
    assert {r.strategy for r in suite.runs} == {"naive", "joint", "replay", "ewc", "lwf", "agem"}
    assert {r.benchmark for r in suite.runs} == {"digits-domains", "digits-dirichlet"}
    assert {r.order for r in suite.runs} == {"default", "reverse", "perm1"} and {r.seed for r in suite.runs} == {0}
    assert len(suite.runs) == 2 * 6 * 3
    assert {r.config["model"]["class_path"] for r in suite.runs} <= {"mlp", "cnn"}
    preflight(suite)  # every strategy's init_args match its signature


@pytest.mark.parametrize("change, where, what", [
    ({"strategy_list": ["naive"]}, "strategy_list", "unknown key"),
    ({"strategies": ["naiv"]}, "strategies[0].class_path", "did you mean 'naive'"),
    ({"strategies": []}, "strategies", "needs at least 1 item(s), got []"),
    ({"strategies": ["naive", "naive"]}, "strategies[1]", "same run as"),
    ({"strategies": [{"class_path": "naive", "args": {}}]}, "strategies[0].args", "unknown key"),
    ({"orders": ["default", {"shuffle": 3}]}, "orders[1]", "unrecognised order"),
    ({"orders": ["default", "default"]}, "orders", "listed twice"),
    ({"seeds": [0, -1]}, "seeds[1]", "must be >= 0, got -1"),
    ({"seeds": "0"}, "seeds", "expected list, got str '0'"),
    ({"name": "my suite"}, "name", "invalid suite name"),
    ({"threads": 0}, "threads", "must be >= 1, got 0"),
    ({"base": {"seed": 3}}, "base.seed", "set by the grid"),
    ({"base": {"train": {"epochs": "two"}}}, "train.epochs", "expected int"),
    ({"base": {"train": {"epochz": 2}}}, "train.epochz", "did you mean 'epochs'"),
])
def test_bad_suites_are_one_line_errors_naming_file_and_field(tmp_path, change, where, what):
    path = write_suite(tmp_path, smoke(**change))
    with pytest.raises(UserError) as info:
        load_suite(path)
    message = info.value.one_line()
    assert str(path) in message and where in message and what in message
    assert "\n" not in message


def test_missing_field_and_missing_file(tmp_path):
    data = smoke()
    del data["orders"]
    with pytest.raises(UserError, match="missing 'orders'"):
        load_suite(write_suite(tmp_path, data))
    with pytest.raises(UserError, match="does not exist"):
        load_suite(tmp_path / "nope.yaml")


def test_preflight_checks_init_args_before_any_run(tmp_path, monkeypatch):
    path = write_suite(tmp_path, smoke(strategies=[{"class_path": "naive", "init_args": {"lr": 1}}]))
    calls = spy_runner(monkeypatch)
    with pytest.raises(UserError) as info:
        run_suite(load_suite(path), tmp_path / "out", console=quiet())
    assert f"{path}: strategies[0].init_args.lr" in info.value.one_line()
    assert calls == []


def test_an_order_every_cell_would_fail_on_stops_the_suite_before_any_cell_and_writes_nothing(
        tmp_path, monkeypatch, capsys):
    path = write_suite(tmp_path, smoke(orders=["default", "backwards"]))
    calls = spy_runner(monkeypatch)
    out = tmp_path / "out"
    assert main(["leaderboard", "run", "--no-render", "--suite", str(path), "--output", str(out), "--no-progress"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"clbench: error: {path}: orders (digits-domains): "
                                                   "unknown order 'backwards' (valid named orders: "), lines
    assert calls == [] and not out.exists()  # no cell ran, no manifest, no folder


@pytest.mark.parametrize("orders, message", [
    (["default", ["rot0", "rot90"]], "orders default and [rot0, rot90] are the same order of this stream (rot0, rot90)"),
    (["reverse", {"permutation": 0}, ["rot90", "rot0"]],
     "orders reverse and [rot90, rot0] are the same order of this stream (rot90, rot0)"),
    (["default", {"permutation": 1}], "orders default and {permutation: 1} are the same order of this stream (rot0, rot90)")])
def test_two_orders_that_are_the_same_sequence_stop_the_suite_before_any_cell(
        tmp_path, monkeypatch, capsys, orders, message):
    """Like a repeated seed: the same order under two labels would run its cells twice."""
    path = write_suite(tmp_path, smoke(orders=orders))
    calls = spy_runner(monkeypatch)
    out = tmp_path / "out"
    assert main(["leaderboard", "run", "--no-render", "--suite", str(path), "--output", str(out), "--no-progress"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"clbench: error: {path}: orders (digits-domains): {message} (list each order once)"], lines
    assert calls == [] and not out.exists()


def test_slurm_launcher_without_slurm_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no srun, no sbatch
    out = tmp_path / "out"
    assert main(["leaderboard", "run", "--no-render", "--suite", str(SMOKE), "--output", str(out), "--launcher", "slurm"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["clbench: error: --launcher slurm: no SLURM here (srun is not on PATH) (run it on a cluster "
                     "login node, or use --launcher local)"]
    assert not out.exists()


# -- running a suite ----------------------------------------------------------------------------
def test_a_complete_leaderboard_on_a_read_only_disk_prints_its_table(board, tmp_path, capsys, monkeypatch):
    """Nothing to run and the manifest already says so: nothing to write, so a read-only folder
    (a received or archived leaderboard) shows its table instead of being refused."""
    import errno
    import os

    from clbench import io as clbench_io
    from clbench.leaderboard import execute

    out = tmp_path / "lb"
    shutil.copytree(board[0], out)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(out))

    monkeypatch.setattr(execute.tempfile, "mkstemp", read_only)
    monkeypatch.setattr(clbench_io.tempfile, "mkstemp", read_only)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert main(["leaderboard", "run", "--suite", str(SMOKE), "--output", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "4 already done, 0 to run" in captured.out and "ranked by ACC" in captured.out
    assert f"no new entries, so the page is as it was: {out / 'README.md'}, {out / 'index.html'}" in captured.out
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    data = smoke(seeds=[0, 1])  # one more seed: there is something to write, and the disk refuses it
    path = write_suite(tmp_path, data)
    assert main(["leaderboard", "run", "--no-render", "--suite", str(path), "--output", str(out), "--no-progress"]) == 2
    assert "Read-only file system" in capsys.readouterr().err


def test_run_writes_one_verified_entry_per_grid_point_and_prints_the_table(board):
    out, stdout = board
    suite = load_suite(SMOKE)
    files = sorted(p.name for p in (out / "entries").glob("*.json"))
    assert files == sorted(f"{r.hash}.json" for r in suite.runs)
    for k in range(1, 5):
        assert f"run {k} of 4: " in stdout
    assert "naive" in stdout and "joint" in stdout and "ranked by ACC" in stdout
    entries = [e.document for e in E.load_entries(out)]
    for e in entries:
        assert e["status"] == "ok" and e["error"] is None and e["suite"] == "smoke"
        assert e["entry_schema"] == E.ENTRY_SCHEMA and e["harness"]["version"]
        assert e["config_hash"] == config_hash(e["config"])
        assert len(e["r_matrix"]) == (1 if e["strategy"]["name"] == "joint" else 2)
        for key in ("wall_seconds", "cpu_peak_rss_mb"):
            assert e["compute"][key] > 0
        assert e["model"]["params_trainable"] == e["model"]["params_total"] > 0
        assert "gmean" in e["matrices"] and "mauc" in e["matrices"]
    manifest = json.loads((out / "suite.json").read_text())
    assert [r["hash"] for r in manifest["runs"]] == [r.hash for r in suite.runs]
    assert not (out / RUNS_DIR).exists()  # working folders are cleaned up once entries exist
    # the run ends with its page, and says where it is
    assert f"wrote {out / 'README.md'}, {out / 'index.html'} and {out / 'pages'}/" in stdout
    assert "| naive" in (out / "README.md").read_text() and "<table" in (out / "index.html").read_text()


def test_no_render_leaves_the_page_to_a_later_render(board, tmp_path, capsys):
    out = copy_board(board, tmp_path)
    for page in ("README.md", "index.html"):
        (out / page).unlink()
    assert main(["leaderboard", "run", "--no-render", "--suite", str(SMOKE), "--output", str(out),
                 "--no-progress"]) == 0
    assert f"render the page with: clbench leaderboard render {out}" in capsys.readouterr().out
    assert not (out / "README.md").exists() and not (out / "index.html").exists()
    # without the flag, a folder whose page is missing gets it even when nothing new ran
    assert main(["leaderboard", "run", "--suite", str(SMOKE), "--output", str(out), "--no-progress"]) == 0
    assert f"wrote {out / 'README.md'}" in capsys.readouterr().out and (out / "index.html").is_file()


def test_second_run_does_no_work_and_deleting_an_entry_reruns_only_it(board, tmp_path, monkeypatch):
    out = copy_board(board, tmp_path)
    suite = load_suite(SMOKE)
    before = {p.name: p.read_bytes() for p in (out / "entries").glob("*.json")}
    calls = spy_runner(monkeypatch)
    outcome = run_suite(suite, out, console=quiet())
    assert calls == [] and outcome.ran == [] and sorted(outcome.skipped) == sorted(r.hash for r in suite.runs)
    assert {p.name: p.read_bytes() for p in (out / "entries").glob("*.json")} == before

    victim = suite.runs[1]
    old = json.loads(E.entry_path(out, victim.hash).read_text())
    E.entry_path(out, victim.hash).unlink()
    outcome = run_suite(suite, out, console=quiet())
    assert calls == [(victim.hash, False)] and outcome.ran == [victim.hash]
    new = E.read_entry(E.entry_path(out, victim.hash))
    assert new["r_matrix"] == old["r_matrix"]  # same config, same seed, same numbers
    for other in (r for r in suite.runs if r is not victim):
        assert E.entry_path(out, other.hash).read_bytes() == before[f"{other.hash}.json"]


def test_force_reruns_everything_and_threads_are_recorded(board, tmp_path, monkeypatch):
    import torch

    out = copy_board(board, tmp_path)
    suite = load_suite(SMOKE)
    old = {e.config_hash: e.document for e in E.load_entries(out)}
    threads = torch.get_num_threads()
    calls = spy_runner(monkeypatch)
    outcome = run_suite(suite, out, force=True, console=quiet())
    grid = [r.hash for r in orders_first(suite.runs)]
    assert [h for h, resumed in calls] == grid and not any(r for _, r in calls)
    assert outcome.ran == grid and outcome.skipped == []
    for e in (loaded.document for loaded in E.load_entries(out)):
        assert e["execution"]["torch_threads"] == suite.threads == 1
        assert e["r_matrix"] == old[e["config_hash"]]["r_matrix"]
        assert e["created_at"] >= old[e["config_hash"]]["created_at"]
    assert torch.get_num_threads() == threads  # the process's setting is restored


def test_interrupted_suite_keeps_finished_entries_and_continues(tmp_path, monkeypatch):
    suite = load_suite(SMOKE)
    out = tmp_path / "lb"

    def interrupt_second(cfg, n):
        if n == 2:
            raise KeyboardInterrupt

    spy_runner(monkeypatch, fail_on=interrupt_second)
    with pytest.raises(KeyboardInterrupt):
        run_suite(suite, out, console=quiet())
    assert [p.stem for p in (out / "entries").glob("*.json")] == [suite.runs[0].hash]

    monkeypatch.undo()
    calls = spy_runner(monkeypatch)
    outcome = run_suite(suite, out, console=quiet())
    assert [h for h, _ in calls] == [r.hash for r in orders_first(suite.runs)[1:]]
    assert outcome.skipped == [suite.runs[0].hash]
    assert len(E.load_entries(out)) == 4


def test_a_grid_runs_order_by_order_so_a_stopped_one_leaves_whole_pairs(tmp_path, monkeypatch):
    """The suite expands method by method; it runs task order by task order, every method's run of
    one order before the next order's, so the runs done when it stops pair up."""
    bench = {"class_path": "digits-domains", "init_args": {"domains": ["rot0", "rot90", "rot180"]}}
    suite = load_suite(write_suite(tmp_path, {**smoke(), "benchmarks": [bench], "strategies": ["naive", "joint", "ewc"],
                                              "orders": ["default", "reverse", ["rot90", "rot0", "rot180"]]}))
    orders = list(dict.fromkeys(r.order for r in suite.runs))
    assert len(orders) == 3 and [(r.strategy, r.order) for r in suite.runs][:3] == [("naive", o) for o in orders]

    calls = spy_runner(monkeypatch)
    run_suite(suite, tmp_path / "lb", console=quiet())
    by_hash = {r.hash: (r.strategy, r.order) for r in suite.runs}
    assert [by_hash[h] for h, _ in calls] == [(s, o) for o in orders for s in ("naive", "joint", "ewc")]


def test_a_killed_suite_resumes_the_interrupted_run_from_its_checkpoint(board, tmp_path, monkeypatch):
    """SIGKILL ``clbench leaderboard run`` in the second experience; the rerun continues that run.
    Unpinned kernels: the command would pin them, and this process, which computed already, could not
    go on at that level (a resume under another level starts over: test_cpu_kernels.py)."""
    from clbench.engine.runner import CHECKPOINT

    suite = load_suite(write_suite(tmp_path, smoke(strategies=["naive"], orders=["default"], cpu_kernels="native")))
    digest = suite.runs[0].hash
    out = tmp_path / "lb"
    killed = run_cli("leaderboard", "run", "--no-render", "--suite", str(suite.path), "--output", str(out), "--no-progress",
                     env=kill_env("stage:1:step:0"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (out / RUNS_DIR / digest / CHECKPOINT).is_file()
    assert (out / RUNS_DIR / f"{digest}.lock").is_file()  # the killed process's lock: stale, taken over below
    assert not E.entry_path(out, digest).exists()

    calls = spy_runner(monkeypatch)
    outcome = run_suite(suite, out, console=quiet())
    assert calls == [(digest, True)] and outcome.resumed == [digest]
    resumed = E.read_entry(E.entry_path(out, digest))
    uninterrupted = E.read_entry(E.entry_path(board[0], digest))
    assert resumed["r_matrix"] == uninterrupted["r_matrix"]  # bit-identical to the run that was never killed
    assert not (out / RUNS_DIR).exists()


def test_stale_working_folder_starts_over_and_finished_result_is_recovered(board, tmp_path, monkeypatch):
    suite = load_suite(write_suite(tmp_path, smoke(strategies=["naive"], orders=["default", "reverse"])))
    first, second = suite.runs
    out = tmp_path / "lb"
    stale = out / RUNS_DIR / first.hash
    stale.mkdir(parents=True)
    (stale / "leftover.txt").write_text("from an older attempt")
    finished = out / RUNS_DIR / second.hash
    finished.mkdir(parents=True)
    result = {k: v for k, v in E.read_entry(E.entry_path(board[0], second.hash)).items()
              if k not in ("entry_schema", "error", "harness", "suite", "created_at", "content_hash")}
    (finished / "result.json").write_text(json.dumps(result))

    calls = spy_runner(monkeypatch)
    outcome = run_suite(suite, out, console=quiet())
    assert calls == [(first.hash, False)]
    assert outcome.ran == [first.hash] and outcome.recovered == [second.hash]
    assert E.read_entry(E.entry_path(out, second.hash))["r_matrix"] == result["r_matrix"]
    assert not (out / RUNS_DIR).exists()


def test_failed_runs_are_recorded_and_the_suite_goes_on(tmp_path, monkeypatch):
    suite = load_suite(SMOKE)
    out = tmp_path / "lb"

    def diverge_joint(cfg, n):
        if cfg["strategy"]["class_path"] == "joint":
            raise NonFiniteLoss("training loss became nan in epoch 0 (experience 0)")

    spy_runner(monkeypatch, fail_on=diverge_joint)
    outcome = run_suite(suite, out, console=quiet())
    joint = [r.hash for r in suite.runs if r.strategy == "joint"]
    assert sorted(outcome.failed) == sorted(joint) and len(outcome.ran) == 2
    for digest in joint:
        entry = E.read_entry(E.entry_path(out, digest))
        assert entry["status"] == "failed" and "loss became nan" in entry["error"]
        assert entry["config_hash"] == digest and "r_matrix" not in entry
        assert not (out / RUNS_DIR / digest).exists()
    table = build_tables(E.load_entries(out))[0]
    joint_row = next(r for r in table.rows if r.strategy == "joint")
    assert len(joint_row.failed) == 2 and joint_row.stats == {} and joint_row.rank is None

    monkeypatch.undo()
    calls = spy_runner(monkeypatch)
    run_suite(suite, out, console=quiet())
    assert calls == []  # a failed entry is a result too
    run_suite(suite, out, console=quiet(), retry_failed=True)
    assert sorted(h for h, _ in calls) == sorted(joint)
    assert all(E.read_entry(E.entry_path(out, h))["status"] == "ok" for h in joint)


@pytest.mark.skipif(not (REPO / "leaderboard" / "entries").is_dir(), reason="no committed leaderboard/")
def test_default_command_on_the_committed_leaderboard_does_no_work(tmp_path, monkeypatch, capsys):
    """``clbench leaderboard run`` with no suite is the quickstart suite, and leaderboard/ holds all of it."""
    out = tmp_path / "leaderboard"
    shutil.copytree(REPO / "leaderboard", out)
    monkeypatch.chdir(REPO)
    calls = spy_runner(monkeypatch)
    readme = (out / "README.md").read_bytes()
    assert main(["leaderboard", "run", "--output", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert calls == [] and (out / "README.md").read_bytes() == readme  # nothing new: the page is left alone
    assert "suite quickstart: 36 runs, 36 already done, 0 to run" in printed
    # said before the table, so the committed numbers are not taken for a fresh run
    said = printed.index("nothing ran: all 36 grid points already have an entry")
    assert said < printed.index("naive") and "--output runs/quickstart" in printed
    for name in ("naive", "joint", "replay", "ewc", "lwf", "agem"):
        assert name in printed
    assert json.loads((out / "suite.json").read_text()) == json.loads((REPO / "leaderboard" / "suite.json").read_text())


# -- entries ------------------------------------------------------------------------------------
def _one_entry(board, tmp_path) -> tuple[Path, Path, dict]:
    out = copy_board(board, tmp_path)
    path = sorted((out / "entries").glob("*.json"))[0]
    return out, path, json.loads(path.read_text())


def test_tampered_score_is_refused(board, tmp_path, capsys):
    out, path, entry = _one_entry(board, tmp_path)
    page = page_of(out)
    entry["scores"]["acc"] = 0.999
    path.write_text(json.dumps(entry, indent=2))
    with pytest.raises(UserError, match="content hash mismatch"):
        E.read_entry(path)
    assert main(["leaderboard", "render", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(path) in err and "content hash mismatch" in err
    assert page_of(out) == page


def test_tampered_config_is_refused_even_with_a_fresh_content_hash(board, tmp_path):
    _, path, entry = _one_entry(board, tmp_path)
    entry["config"]["train"]["epochs"] = 50
    entry["content_hash"] = E.content_hash(entry)
    path.write_text(json.dumps(entry))
    with pytest.raises(UserError, match="config does not match its config_hash"):
        E.read_entry(path)


def test_entry_under_another_name_is_refused(board, tmp_path):
    _, path, _ = _one_entry(board, tmp_path)
    moved = path.with_name("0" * 64 + ".json")
    path.rename(moved)
    with pytest.raises(UserError, match="file name does not match"):
        E.read_entry(moved)


def test_newer_schema_is_refused(board, tmp_path, capsys):
    out, path, entry = _one_entry(board, tmp_path)
    entry["entry_schema"] = E.ENTRY_SCHEMA + 1
    entry["content_hash"] = E.content_hash(entry)
    path.write_text(json.dumps(entry))
    with pytest.raises(UserError, match="newer than this clbench reads") as info:
        E.read_entry(path)
    assert "upgrade clbench" in info.value.one_line()
    assert main(["compare", str(out)]) == 2
    assert "newer than this clbench reads" in capsys.readouterr().err
    # run refuses too, instead of silently redoing or overwriting the entry
    with pytest.raises(UserError, match="newer"):
        run_suite(load_suite(SMOKE), out, console=quiet())


def test_broken_json_and_foreign_files_are_refused(board, tmp_path):
    _, path, _ = _one_entry(board, tmp_path)
    path.write_text('{"entry_schema": 1,')
    with pytest.raises(UserError, match="not valid JSON"):
        E.read_entry(path)
    path.write_text(json.dumps({"hello": "world"}))
    with pytest.raises(UserError, match="not a clbench leaderboard entry"):
        E.read_entry(path)


def test_missing_directory_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        E.load_entries(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no entries/ folder"):
        E.load_entries(tmp_path / "empty")


def test_failed_entry_has_the_identifying_fields():
    cfg = resolve_config(deep_merge(smoke()["base"], {"strategy": "naive"}))
    entry = E.failed_entry(cfg, "boom\nsecond line", env={"git_commit": "abc", "device": "cpu"}, wall_seconds=1.5)
    assert entry["error"] == "boom second line"
    assert E.verify_entry(copy.deepcopy(entry), "x") == entry
    assert entry["strategy"]["name"] == "naive" and entry["config_hash"] == config_hash(cfg)


# -- scores recomputed from R, stray files, the manifest ------------------------------------------
def _edit_scores(entry: dict, edit: str) -> str:
    """Apply one edit to an ok entry (its content hash recomputed after); returns the score named in the error."""
    if edit == "acc":
        entry["scores"]["acc"] = 0.999
    elif edit == "hidden bwt":
        entry["scores"]["bwt"] = None
    elif edit == "dropped bwt":
        del entry["scores"]["bwt"]
        return "bwt"
    elif edit == "gmean_final":
        entry["scores"]["gmean_final"] += 0.05
    elif edit == "r_matrix":
        entry["r_matrix"][-1][0] = 0.0  # scores left as they were
        return "acc"
    elif edit == "invented score":
        entry["scores"]["acc_best"] = 1.0
        return "acc_best"
    return edit.split()[-1]


@pytest.mark.parametrize("edit", ["acc", "hidden bwt", "dropped bwt", "gmean_final", "r_matrix", "invented score"])
def test_edited_scores_are_refused_even_with_a_fresh_content_hash(board, tmp_path, capsys, edit):
    out = copy_board(board, tmp_path)
    page = page_of(out)
    path = next(p for p in sorted((out / "entries").glob("*.json")) if json.loads(p.read_text())["strategy"]["name"]
                == "naive")
    entry = json.loads(path.read_text())
    score = _edit_scores(entry, edit)
    entry["content_hash"] = E.content_hash(entry)
    path.write_text(json.dumps(entry, indent=2))
    for command in (["leaderboard", "render", str(out)], ["compare", str(out)]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and str(path) in err, err
        assert f"score '{score}'" in err or f"{score} missing" in err, err
    assert page_of(out) == page
    with pytest.raises(UserError):
        run_suite(load_suite(SMOKE), out, console=quiet())  # run's check of what is done refuses it too


def test_joint_entries_with_one_stage_verify_and_an_edited_one_does_not(board, tmp_path):
    out = copy_board(board, tmp_path)
    path = next(p for p in sorted((out / "entries").glob("*.json")) if json.loads(p.read_text())["strategy"]["name"]
                == "joint")
    entry = E.read_entry(path)
    assert len(entry["r_matrix"]) == 1 and entry["scores"]["bwt"] is None
    entry["scores"]["bwt"] = 0.0  # a single stage has nothing to forget between
    entry["content_hash"] = E.content_hash(entry)
    path.write_text(json.dumps(entry))
    with pytest.raises(UserError, match="score 'bwt' is 0.0 but the entry's matrices give null"):
        E.read_entry(path)


@pytest.mark.parametrize("stray, message, fix", [
    ("copy.json", "not an entry file name", "delete it: {digest}.json holds the same run"),
    ("0" * 64 + ".json", "file name does not match its config_hash", "rename it to {digest}.json"),
    ("notes.txt", "not an entry file name", "move it out of"),
])
def test_stray_files_in_entries_are_reported_not_ignored(board, tmp_path, monkeypatch, capsys, stray, message, fix):
    out = copy_board(board, tmp_path)
    assert (out / "suite.json").exists()  # with a manifest, render only reads the suite's own hashes
    source = sorted((out / "entries").glob("*.json"))[0]
    digest = source.stem
    target = out / "entries" / stray
    if stray.endswith(".txt"):
        target.write_text("my notes")
    elif stray.startswith("0"):
        source.rename(target)
    else:
        shutil.copy(source, target)
    for command in (["leaderboard", "render", str(out)], ["compare", str(out)]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and str(target) in err and message in err and fix.format(digest=digest) in err
    calls = spy_runner(monkeypatch)
    with pytest.raises(UserError, match=message):
        run_suite(load_suite(SMOKE), out, console=quiet())
    assert calls == []  # refused before any run
    assert target.exists()  # reported, not deleted


@pytest.mark.parametrize("text, what", [
    ('{"name": "smoke", "runs": [', "not valid JSON"),
    ("[]", "expected a JSON object"),
    ('{"name": "smoke"}', "'runs'"),
    ('{"name": "smoke", "runs": [{"hash": "abc"}]}', "runs[0] has no valid 'hash'"),
    ('{"runs": []}', "'name'"),
])
def test_malformed_suite_json_is_refused(board, tmp_path, capsys, text, what):
    out = copy_board(board, tmp_path)
    page = page_of(out)
    (out / "suite.json").write_text(text)
    for command in (["leaderboard", "render", str(out)], ["compare", str(out)]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and str(out / "suite.json") in err and what in err, err
    assert page_of(out) == page
    (out / "suite.json").unlink()  # no manifest at all: every entry is shown
    assert main(["leaderboard", "render", str(out)]) == 0
