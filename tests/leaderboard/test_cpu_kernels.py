"""A suite pins the CPU kernels' level and its entries record it; ``verify`` reruns an entry at the
level it records, whatever this machine's own level, so an entry verifies exactly on another CPU
class. Shown with ``default`` (ATen's scalar kernels, MKL's compatible path) standing in for the
other class: a run at ``default`` and the committed entry of the same grid point, pinned to AVX2,
differ (the control), yet verify, started at this CPU's native level, reproduces the ``default``
entry bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clbench import cpu_kernels
from clbench.leaderboard.verify import compare

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "suites" / "quickstart.yaml"
pytestmark = pytest.mark.skipif(not cpu_kernels.x86(), reason="kernel levels are pinned on x86-64 only")


def _clbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The clbench command in a fresh process (it pins before torch is imported), with no pin inherited."""
    env = {k: v for k, v in os.environ.items() if k not in cpu_kernels.VARIABLES}
    return subprocess.run([sys.executable, "-m", "clbench.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def _one_cell_suite(folder: Path, level: str) -> Path:
    """Quickstart's naive on digits-dirichlet, reverse order: a cell whose G-mean and MAUC change with
    the kernels' rounding (measured: ``default`` and AVX2 differ in scores.global_mauc)."""
    suite = yaml.safe_load(QUICKSTART.read_text())
    suite.update(benchmarks=["digits-dirichlet"], strategies=["naive"], orders=["reverse"], cpu_kernels=level)
    path = folder / f"{level}.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


def _entry(board: Path) -> tuple[Path, dict]:
    path = next((board / "entries").glob("*.json"))
    return path, json.loads(path.read_text())


@pytest.fixture(scope="module")
def boards(tmp_path_factory) -> dict[str, Path]:
    """The cell made by the command at the ``default`` level and unpinned (``native``), both on this
    CPU: the committed entries were made on another vendor's, whose MKL branches are not this one's."""
    folder = tmp_path_factory.mktemp("kernels")
    made = {}
    for level in ("default", "native"):
        board = folder / f"lb-{level}"
        done = _clbench("leaderboard", "run", "--no-render", "--suite", str(_one_cell_suite(folder, level)), "--output", str(board),
                        "--no-progress", "--allow-dirty", cwd=folder)
        assert done.returncode == 0, done.stderr[-2000:]
        _as_clean(board)
        made[level] = board
    return made


def _as_clean(board: Path) -> None:
    """Mark the entry made from a clean tree, as CI's clean checkout would (``verify`` reruns only
    those); the subprocess saw this working tree's changes."""
    from clbench.leaderboard.entries import content_hash

    path, entry = _entry(board)
    entry["env"]["git_dirty"] = False
    entry["content_hash"] = content_hash(entry)
    path.write_text(json.dumps(entry))


@pytest.mark.slow
def test_entries_record_the_level_they_ran_at_and_the_level_changes_the_numbers(boards):
    _, pinned = _entry(boards["default"])
    _, native = _entry(boards["native"])  # the same grid point unpinned (a run setting: same hash)
    assert pinned["env"]["cpu"]["pin"] == "default" and pinned["env"]["cpu"]["isa"] == "DEFAULT"
    assert native["env"]["cpu"]["pin"] is None
    largest, where, _, _ = compare(pinned, native)
    assert largest > 0, "the control: the kernels' level must change this cell, or the test below shows nothing"


@pytest.mark.slow
def test_verify_reruns_at_the_recorded_level_in_its_own_process_and_in_a_fresh_one(boards, tmp_path, capsys):
    from clbench.cli.main import main

    entry_path, entry = _entry(boards["default"])
    # 1. the command, started at this CPU's native level, pins its own process to the entry's level
    done = _clbench("leaderboard", "verify", str(boards["default"]), "--trust-code", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert f"{entry_path.stem[:12]} " in done.stdout and ": ok (exact" in done.stdout, done.stdout
    # 2. a process that already computes natively (this one) reruns it in a fresh process at that level
    assert cpu_kernels.pinned_level() is None
    assert main(["leaderboard", "verify", str(boards["default"]), "--trust-code"]) == 0
    out = capsys.readouterr().out
    assert ": ok (exact" in out and "1 verified: 1 ok, 0 differ" in out, out


def test_a_level_the_cpu_lacks_or_does_not_know_is_one_line(monkeypatch):
    from clbench.errors import UserError

    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: frozenset({"sse2", "avx2", "fma"}))
    assert cpu_kernels.available() == ["default", "avx2"]
    assert cpu_kernels.check_level("AVX2", where="x") == "avx2"
    with pytest.raises(UserError, match=r"^--cpu-kernels: this CPU cannot compute at level avx512 \(levels it "
                                        r"has: default, avx2\) \(use native"):
        cpu_kernels.check_level("avx512", where="--cpu-kernels")
    with pytest.raises(UserError, match="unknown CPU kernel level 'avx9'.*use one of native, default, avx2, avx512"):
        cpu_kernels.check_level("avx9", where="--cpu-kernels")


def test_the_cpu_class_of_a_pin_is_its_vendor(monkeypatch):
    """MKL's AVX2/AVX-512 branches are Intel's own (elsewhere MKL takes its automatic branch), so
    an entry pinned there is exact on CPUs of its vendor only; older entries' vendor is read off
    the model name, and a run records its CPU's."""
    from clbench.results.assemble import cpu_identity

    amd, intel = {"model": "AMD EPYC", "pin": "avx2"}, {"model": "Intel(R) Xeon(R) Processor", "vendor": "GenuineIntel"}
    assert [cpu_kernels.vendor_of(c) for c in (amd, intel, {"model": "Elsewhere CPU"}, None)] == \
        ["AuthenticAMD", "GenuineIntel", None, None]
    assert cpu_kernels.exact_across("avx2", amd, {"model": "AMD EPYC 9B14", "vendor": "AuthenticAMD"})
    assert not cpu_kernels.exact_across("avx2", amd, intel) and not cpu_kernels.exact_across("avx512", intel, amd)
    assert not cpu_kernels.exact_across("avx2", {"model": "Elsewhere CPU"}, {"model": "Elsewhere CPU"})  # unknown
    assert cpu_kernels.exact_across("default", amd, intel)  # MKL's COMPATIBLE branch is every vendor's
    assert not cpu_kernels.exact_across("native", amd, amd)
    recorded = cpu_identity()["vendor"]
    assert recorded == cpu_kernels.cpu_vendor()
    if Path("/proc/cpuinfo").is_file():
        assert recorded and f"vendor_id\t: {recorded}" in Path("/proc/cpuinfo").read_text()


def test_a_process_that_already_computed_is_not_claimed_pinned():
    """Once torch has computed in a process, a pin cannot take effect there, and none is claimed."""
    import torch

    torch.ones(3).exp().sum()
    before = {name: os.environ.get(name) for name in cpu_kernels.VARIABLES}
    assert cpu_kernels.pin(cpu_kernels.LEVELS["default"]) is False
    assert {name: os.environ.get(name) for name in cpu_kernels.VARIABLES} == before
    assert cpu_kernels.pin({}) is (not any(before.values()))


def test_rerun_variables_follow_what_the_entry_recorded():
    assert cpu_kernels.rerun_variables({"isa": "AVX2", "pin": "avx2"}) == cpu_kernels.LEVELS["avx2"]
    # an entry that pinned nothing: ATen's level as it ran (MKL and oneDNN chose by that CPU)
    assert cpu_kernels.rerun_variables({"isa": "AVX512", "pin": None}) == {"ATEN_CPU_CAPABILITY": "avx512"}
    assert cpu_kernels.rerun_variables(None) == {}


def test_a_suite_pins_avx2_by_default_where_the_cpu_has_it_and_nothing_elsewhere(monkeypatch):
    from clbench.leaderboard.suite import load_suite

    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: frozenset({"sse2", "avx2", "fma"}))
    assert load_suite(QUICKSTART).cpu_kernels == "avx2"
    monkeypatch.setattr(cpu_kernels, "x86", lambda: False)  # an ARM laptop: no level another CPU class shares
    assert load_suite(QUICKSTART).cpu_kernels == "native"


def test_a_resume_under_another_kernel_level_is_refused(tmp_path):
    """A checkpoint records the pin it was made under; the result records one level, so half a run
    made under another is refused (a suite's cell then starts over, as for another thread count)."""
    import torch

    from clbench.engine.checkpoint import check_settings, run_settings
    from clbench.errors import UserError

    here = run_settings()
    assert here["cpu_kernels"] is None  # this process computes unpinned
    check_settings({"settings": here}, tmp_path / "checkpoint.pt")
    check_settings({"settings": {"torch_threads": torch.get_num_threads()}}, tmp_path / "checkpoint.pt")  # older
    with pytest.raises(UserError, match=r"^--cpu-kernels: the run in .* was started with CPU kernels avx2, this "
                                        r"resume would use native .*\(resume with --cpu-kernels avx2"):
        check_settings({"settings": {**here, "cpu_kernels": "avx2"}}, tmp_path / "checkpoint.pt")
