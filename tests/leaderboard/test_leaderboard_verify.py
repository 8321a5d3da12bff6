"""``clbench leaderboard verify``: committed numbers are rerun from their configs and compared."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from clbench.cli.main import main
from clbench.leaderboard import entries as E
from clbench.leaderboard.rescore import expected_scores
from clbench.leaderboard.verify import DIFFERS, NOISE, OK, Verifier, cheapest, select
from clbench.results.assemble import cpu_identity

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "leaderboard"
COMMITTED = [QUICKSTART, *sorted(p for p in (REPO / "leaderboards").glob("*") if (p / "entries").is_dir())]
needs_quickstart = pytest.mark.skipif(not (QUICKSTART / "entries").is_dir(), reason="no committed leaderboard/")


def _entries(folder: Path) -> list[tuple[Path, dict]]:
    return [(p, json.loads(p.read_text())) for p in sorted((folder / "entries").glob("*.json"))]


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _sample_size(folder: Path) -> int:
    return 2 if folder == QUICKSTART else 1


def _sample_cost(folder: Path) -> float:
    paths = cheapest([p for p, _ in _entries(folder)], _sample_size(folder))
    return sum(json.loads(p.read_text())["compute"]["wall_seconds"] for p in paths)


def _forge(path: Path, delta: float) -> tuple[int, int]:
    """Move one R value of the entry by ``delta``, recompute its scores and content hash as a forger would."""
    entry = json.loads(path.read_text())
    i, j = len(entry["r_matrix"]) - 1, 0
    entry["r_matrix"][i][j] += delta
    entry["scores"].update(expected_scores(entry, str(path))[0])
    entry["content_hash"] = E.content_hash(entry)
    path.write_text(json.dumps(entry, indent=2))
    E.read_entry(path)  # the forged entry passes every check a reader makes
    return i, j


def _cheapest_multistage(folder: Path) -> Path:
    """The cheapest entry with more than one training stage (joint has one)."""
    staged = [p for p, e in _entries(folder) if e["status"] == "ok" and len(e["r_matrix"]) > 1]
    return cheapest(staged, 1)[0]


def test_a_forged_entry_is_named_and_the_others_are_ok(clean_smoke_board, tmp_path, capsys):
    out = tmp_path / "lb"
    shutil.copytree(clean_smoke_board, out)
    forged = _cheapest_multistage(out)
    honest = next(p for p in cheapest([p for p, _ in _entries(out)], 3) if p != forged)
    i, j = _forge(forged, 0.01)
    before = _snapshot(out)
    assert main(["leaderboard", "verify", str(out), forged.stem, honest.stem[:10]]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"{forged.stem[:12]} ") and f": differs by 0.01 at R[{i}][{j}] (committed" in lines[0]
    assert lines[1].startswith(f"{honest.stem[:12]} ") and ": ok" in lines[1]
    assert lines[2].startswith("2 verified: 1 ok, 1 differ, 0 cannot be rerun; largest difference 0.01")
    assert _snapshot(out) == before  # the leaderboard is only read
    # a stated tolerance accepts the difference, and still says how large it was
    assert main(["leaderboard", "verify", str(out), forged.stem, "--tolerance", "0.02"]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert f": ok (largest difference 0.01 at R[{i}][{j}], within 0.02" in line


def test_a_difference_names_the_cpus(clean_smoke_board, tmp_path, capsys):
    """CPU rounding is a cause of a difference: the verdict names both CPUs where the entry records
    its own (with its precision where that was not fp32), and says that it does not where it was
    made before env.cpu existed."""
    import torch

    here = cpu_identity()
    assert here["isa"] == torch.backends.cpu.get_cpu_capability() and here["model"]
    out = tmp_path / "lb"
    shutil.copytree(clean_smoke_board, out)
    assert all(e["env"]["cpu"] == here for _, e in _entries(out))
    recorded, unrecorded = [p for p, e in _entries(out) if len(e["r_matrix"]) > 1]
    for path, cpu in ((recorded, {"model": "Elsewhere CPU", "isa": "AVX2"}), (unrecorded, None)):
        entry = json.loads(path.read_text())
        entry["env"].pop("cpu", None)
        if cpu:
            entry["env"].update(cpu=cpu, precision="bf16-mixed")
        path.write_text(json.dumps(entry))
        _forge(path, 0.5)  # far beyond the test set's noise, which judges entries made elsewhere unpinned
    assert main(["leaderboard", "verify", str(out), recorded.stem, unrecorded.stem]) == 1
    # each entry's verdict, whatever the console wrapped: a verdict is longer on a CPU with bf16 units
    text = " ".join(capsys.readouterr().out.split())
    starts = sorted((text.index(p.stem[:12] + " "), p.stem[:12]) for p in (recorded, unrecorded))
    verdict = {key: text[at:end] for (at, key), end in zip(starts, [at for at, _ in starts[1:]] + [len(text)])}
    # the rerun computes in the precision the entry records (clbench.engine.precision.pinned), with
    # the kernels of the ISA it records (AVX2), so an AVX-512 CPU reruns it as an AVX2 one
    assert f"made on Elsewhere CPU (AVX2, bf16-mixed), rerun on {here['model']} (AVX2, bf16-mixed)" \
        in verdict[recorded.stem[:12]]
    assert ("the entry does not record its CPU, and float rounding differs between CPU types (this one: "
            f"{here['model']} ({here['isa']}))") in verdict[unrecorded.stem[:12]]
    # what the committed-leaderboard test reads: which verdicts may be rounding on another CPU
    made_here = next(p for p, e in _entries(out) if len(e["r_matrix"]) == 1)
    verifier = Verifier()
    assert [verifier.verify(p).other_cpu for p in (recorded, unrecorded, made_here)] == [True, True, False]


def test_an_entry_that_cannot_be_exact_here_is_judged_against_its_test_set_noise(clean_smoke_board, tmp_path,
                                                                                    capsys):
    """Made unpinned on another CPU: a difference of a fraction of an R cell's standard error is
    "within noise" (exit 0), one of many SEs "differs". (The same small difference in an entry
    made on this CPU, where the rerun must be exact, differs: test_a_forged_entry_is_named...)"""
    out = tmp_path / "lb"
    shutil.copytree(clean_smoke_board, out)
    elsewhere, far = [p for p, e in _entries(out) if len(e["r_matrix"]) > 1]
    for path, delta in ((elsewhere, 0.3), (far, 40.0)):
        entry = json.loads(path.read_text())
        entry["env"]["cpu"] = {"model": "Elsewhere CPU", "isa": "AVX2", "pin": None}
        path.write_text(json.dumps(entry))
        _forge(path, delta * entry["r_stderr"][len(entry["r_matrix"]) - 1][0])
    assert main(["leaderboard", "verify", str(out), elsewhere.stem]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert ": within noise: 0.3 SE at R[" in line and "made with unpinned kernels on another CPU" in line, line
    assert main(["leaderboard", "verify", str(out), far.stem]) == 1
    line = capsys.readouterr().out.splitlines()[0]
    assert ": differs by" in line and "40 SE at R[" in line, line


@needs_quickstart
def test_an_entry_that_no_longer_verifies_on_reading_differs(tmp_path, capsys):
    out = tmp_path / "lb"
    shutil.copytree(QUICKSTART, out)
    path = _cheapest_multistage(out)
    entry = json.loads(path.read_text())
    entry["r_matrix"][-1][0] += 0.01  # scores left stale, content hash recomputed
    entry["content_hash"] = E.content_hash(entry)
    path.write_text(json.dumps(entry))
    assert main(["leaderboard", "verify", str(out), path.stem]) == 1
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith(path.stem[:12]) and "differs from its own record" in line and "score 'acc'" in line


@needs_quickstart
def test_entries_from_uncommitted_code_or_failed_runs_cannot_be_rerun(tmp_path, capsys):
    out = tmp_path / "lb"
    shutil.copytree(QUICKSTART, out)
    dirty, failed = cheapest([p for p, _ in _entries(out)], 2)
    entry = json.loads(dirty.read_text())
    entry["env"]["git_dirty"] = True
    entry["content_hash"] = E.content_hash(entry)
    dirty.write_text(json.dumps(entry))
    entry = json.loads(failed.read_text())
    gone = E.failed_entry(entry["config"], "boom", env=entry["env"], wall_seconds=1.0, suite="quickstart")
    failed.write_text(json.dumps(gone))
    assert main(["leaderboard", "verify", str(out), dirty.stem, failed.stem]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "cannot rerun: made from uncommitted code" in lines[0]
    assert "cannot rerun: the committed run failed" in lines[1] and "boom" in lines[1]
    assert lines[2].startswith("2 verified: 0 ok, 0 differ, 2 cannot be rerun")


def test_sample_takes_the_cheapest_ok_entries_ties_by_hash(tmp_path):
    folder = tmp_path / "entries"
    folder.mkdir()
    costs = {"c" * 64: 0.5, "a" * 64: 2.0, "b" * 64: 0.5, "d" * 64: 0.1}
    for digest, seconds in costs.items():
        status = "failed" if digest == "d" * 64 else "ok"
        (folder / f"{digest}.json").write_text(json.dumps({"status": status, "compute": {"wall_seconds": seconds}}))
    picked = cheapest(sorted(folder.iterdir()), 2)
    assert [p.stem[0] for p in picked] == ["b", "c"]  # the failed entry is not a candidate


@pytest.mark.parametrize("args, message", [
    (["{tmp}/nowhere"], "{tmp}/nowhere: leaderboard directory {tmp}/nowhere does not exist"),
    (["{tmp}/lb", "ffffffff"], "ENTRY_ID: no entry 'ffffffff' in {tmp}/lb/entries"),
    (["{tmp}/lb", "--sample", "0"], "--sample: expected at least 1"),
    (["{tmp}/lb", "--tolerance", "-1"], "--tolerance: expected a finite number >= 0"),
])
@needs_quickstart
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    shutil.copytree(QUICKSTART, tmp_path / "lb")
    assert main(["leaderboard", "verify", *(a.replace("{tmp}", str(tmp_path)) for a in args)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("clbench: error: ") and "\n" not in err and captured.out == ""
    assert message.replace("{tmp}", str(tmp_path)) in err, err


def _cpu_of(env: dict) -> str | None:
    cpu = env.get("cpu")
    return f"{cpu.get('model')} ({cpu.get('isa')})" if isinstance(cpu, dict) else None


# The test suite reruns a leaderboard's cheapest entry only where it took at most this long to make:
# the whole suite has 20 minutes on two cores, and a board whose cheapest run takes minutes (the
# validation search's GEM-free runs, the powered SmolLM2 suites) is verified by hand, as the skip says.
RERUN_BUDGET_S = 100


def _committed_params():
    params = []
    for folder in COMMITTED:
        if not (folder / "entries").is_dir():
            continue
        cost, name = _sample_cost(folder), str(folder.relative_to(REPO))
        marks = [pytest.mark.slow] if cost > 5 else []
        if cost > RERUN_BUDGET_S:
            marks.append(pytest.mark.skip(reason=(
                f"its cheapest entry took {cost:.0f} s to make, more than the {RERUN_BUDGET_S} s the test suite "
                f"gives a rerun: verify it with 'clbench leaderboard verify {name} --sample 1'")))
        params.append(pytest.param(folder, id=name, marks=marks))
    return params


@pytest.mark.parametrize("folder", _committed_params())
def test_committed_leaderboards_reproduce(folder):
    """Every committed leaderboard made from clean trees reruns to the same numbers (a sample: its cheapest)."""
    dirty = [p.name for p, e in _entries(folder) if (e.get("env") or {}).get("git_dirty")]
    if dirty:
        pytest.skip(f"{len(dirty)} entries were made from uncommitted code (cannot be rerun by construction): "
                    "regenerate the folder from a clean tree")
    from clbench.models.lm import gguf as ckpt

    presets = {(e.get("model") or {}).get("init_args", {}).get("path") for _, e in _entries(folder)} & set(ckpt.PRESETS)
    missing = sorted(name for name in presets if not ckpt.converted_folder(ckpt.PRESETS[name].sha256).is_dir())
    if missing:  # CI downloads no model (README): such a leaderboard is verified where it was fetched
        pytest.skip(f"its model {', '.join(missing)} is not fetched here (clbench models fetch {missing[0]})")
    from clbench.benchmarks import fashion_mnist as fm

    fashion = any(str((e.get("benchmark") or {}).get("name", "")).startswith("fashion-mnist") for _, e in _entries(folder))
    if fashion and fm.installed_root() is None:
        # .ci/run installs the Debian package; elsewhere its tests skip, saying why (as here)
        pytest.skip(f"its benchmark reads the Fashion-MNIST files, not installed here: {fm.FIX}")
    sample = select(folder, sample=_sample_size(folder))
    # An entry made unpinned on another CPU class (or before entries recorded theirs) cannot fail
    # here: a differing rerun is only reported (below). Its rerun, minutes for some, is skipped up
    # front. An entry with pinned kernels reruns at its level here, and must be exact.
    here = _cpu_of({"cpu": cpu_identity()})
    elsewhere = [p.name for p in sample if not (env := json.loads(p.read_text()).get("env") or {}).get("cuda")
                 and not (env.get("cpu") or {}).get("pin") and _cpu_of(env) != here]
    if elsewhere and len(elsewhere) == len(sample):
        pytest.skip(f"its sampled entries were made on another CPU than this {here} (or one not recorded), and exact "
                    f"reruns hold only on the CPU class that made them: {', '.join(elsewhere)}")
    before = _snapshot(folder)
    verifier = Verifier()
    verdicts = [verifier.verify(path) for path in sample]
    assert _snapshot(folder) == before
    failed = [v for v in verdicts if v.status not in (OK, NOISE)]  # NOISE: judged, for entries made elsewhere
    report = "\n".join(v.line for v in verdicts)
    # Bit-equal reruns hold on the CPU class that made an entry (docs/leaderboard.md): an entry that
    # records this machine's CPU must rerun exactly; one made on another CPU, or before entries
    # recorded theirs, is reported, not failed, as its difference may be rounding.
    if failed and all(v.status == DIFFERS and v.other_cpu for v in failed):
        pytest.skip(f"made on another CPU (or one not recorded), and exact reruns hold only on the CPU class "
                    f"that made them: {report}")
    assert not failed, report


def test_every_committed_entry_was_made_from_a_clean_tree():
    """No committed number from uncommitted code: each entry records a commit and a clean tree."""
    unclean = []
    for folder in COMMITTED:
        for path, entry in _entries(folder):
            env = entry.get("env") or {}
            if env.get("git_dirty") is not False or not env.get("git_commit"):
                state = "dirty" if env.get("git_dirty") else "no record of its tree"
                unclean.append(f"{path.relative_to(REPO)} ({state})")
    assert not unclean, (f"{len(unclean)} committed entries were not made from a clean tree; regenerate their "
                         "leaderboards from a clean checkout with 'clbench leaderboard run --force':\n"
                         + "\n".join(unclean))


# -- a received folder is untrusted: verify runs only installed code, within the suite's bounds ------------
def _edit_config(path: Path, change) -> Path:
    """Change an entry's config and recompute every hash, as a forger would; the entry's new path."""
    from clbench.config.load import config_hash

    entry = json.loads(path.read_text())
    change(entry["config"])
    entry["config_hash"] = config_hash(entry["config"])
    entry["content_hash"] = E.content_hash(entry)
    path.unlink()
    new = path.parent / f"{entry['config_hash']}.json"
    new.write_text(json.dumps(entry, indent=2))
    E.read_entry(new)  # passes every check a reader makes
    return new


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("clbench: error: ") and "\n" not in err, err
    return err


def test_an_entry_naming_a_plugin_file_is_refused_before_it_runs_and_runs_with_trust_code(
        clean_smoke_board, tmp_path, capsys):
    out = tmp_path / "lb"
    shutil.copytree(clean_smoke_board, out)
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.py"
    evil.write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('x')\n"
                    "from clbench.strategies.naive import Naive\n\nclass Evil(Naive):\n    pass\n")
    naive = next(p for p, e in _entries(out) if e["strategy"]["name"] == "naive")
    forged = _edit_config(naive, lambda c: c["strategy"].update(class_path=f"{evil}:Evil"))
    assert main(["leaderboard", "verify", str(out)]) == 2
    err = _one_error_line(capsys)
    assert f"{forged}: strategy.class_path is '{evil}:Evil'" in err and f"would import and run {evil}" in err
    assert "--trust-code" in err
    assert not marker.exists()
    with pytest.raises(E.UserError, match="not a registered component"):  # the Python API refuses it too
        Verifier().verify(forged)
    assert not marker.exists()
    assert main(["leaderboard", "verify", str(out), forged.stem, "--trust-code"]) == 0  # Evil is naive
    assert marker.exists()


@pytest.mark.parametrize("field, change, message", [
    ("train.epochs", lambda c: c["train"].update(epochs=1_000_000_000),
     "train.epochs is 1000000000, outside what suite smoke ({suite}) asks (1)"),
    ("model.init_args.hidden", lambda c: c["model"]["init_args"].update(hidden=100_000),
     "model.init_args.hidden is 100000, outside what suite smoke ({suite}) asks (32)"),
    ("benchmark.init_args.test_fraction", lambda c: c["benchmark"]["init_args"].update(test_fraction=0.01),
     "benchmark.init_args.test_fraction is 0.01, a field suite smoke ({suite}) never sets"),
    ("trainer.accelerator", lambda c: c["trainer"].update(accelerator="gpu"),
     "trainer.accelerator is \"gpu\", which suite smoke ({suite}) never gives there"),
    ("subprocess", lambda c: c["benchmark"].update(class_path="subprocess:run",
                                                  init_args={"args": ["true"]}),
     "benchmark.class_path is 'subprocess:run', which is not a registered component of an installed package: "
     "rerunning it would import and run {subprocess}"),
])
def test_an_entry_asking_more_than_its_suite_is_refused_naming_the_field(clean_smoke_board, tmp_path, capsys,
                                                                         field, change, message):
    import subprocess

    from clbench.leaderboard.manifest import read_manifest

    out = tmp_path / "lb"
    shutil.copytree(clean_smoke_board, out)
    forged = _edit_config(cheapest([p for p, _ in _entries(out)], 1)[0], change)
    suite = read_manifest(out)["source"]
    located = Path(suite) if Path(suite).is_absolute() else Path.cwd() / suite
    assert main(["leaderboard", "verify", str(out)]) == 2
    err = _one_error_line(capsys)
    expected = message.format(suite=located if located.is_file() else REPO / suite, subprocess=subprocess.__file__)
    assert f"{forged}: {expected}" in err, err


def test_verify_needs_the_suite_from_outside_the_folder_unless_trusted(clean_smoke_board, tmp_path, capsys):
    from helpers import SMOKE

    from clbench.leaderboard.manifest import MANIFEST

    out = tmp_path / "lb"
    shutil.copytree(clean_smoke_board, out)
    manifest = json.loads((out / MANIFEST).read_text())
    shutil.copy(SMOKE, out / "suite.yaml")  # the sender's own copy of the suite bounds nothing
    (out / MANIFEST).write_text(json.dumps({**manifest, "source": str(out / "suite.yaml")}))
    honest = cheapest([p for p, _ in _entries(out)], 1)[0]
    assert main(["leaderboard", "verify", str(out), honest.stem]) == 2
    assert "is inside the folder being verified" in _one_error_line(capsys)
    (out / MANIFEST).write_text(json.dumps({**manifest, "source": str(tmp_path / "gone.yaml")}))
    assert main(["leaderboard", "verify", str(out), honest.stem]) == 2
    assert f"{tmp_path / 'gone.yaml'}, is not here" in _one_error_line(capsys)
    assert main(["leaderboard", "verify", str(out), honest.stem, "--trust-code"]) == 0
