"""perf/gpu_report.py's CPU mode: every measurement gives a number (only the two-GPU part may be
skipped, with its reason), and the markdown report says what the JSON says."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "perf" / "gpu_report.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_report", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def report(out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(out), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


def rows(markdown: str) -> dict[tuple[str, str], list[str]]:
    """(section, measurement) -> the table row's cells."""
    found, section = {}, None
    for line in markdown.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        elif line.startswith("| ") and section and not line.startswith(("| measurement", "| ---")):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            found[(section, cells[0])] = cells
    return found


def test_cuda_plan_fits_one_lease_command():
    """The CUDA default budget (the shares' sum) leaves room for installs and imports in a 9-minute command,
    and the parts run most valuable first: the training ratios, generation, then the grid estimate."""
    gpu_report = load_script()
    assert sum(gpu_report.BUDGETS.values()) <= gpu_report.COMMAND_LIMIT_S == 540
    assert gpu_report.PARTS[:3] == ("lm_train", "generation", "trace_grid")


def test_cpu_mode_measures_everything_and_the_two_reports_agree(tmp_path):
    gpu_report = load_script()
    done = report(tmp_path, "--budget-s", "60")
    assert done.returncode == 0, done.stderr[-3000:]
    assert str(tmp_path / "gpu_report.md") in done.stdout and str(tmp_path / "gpu_report.json") in done.stdout
    data = json.loads((tmp_path / "gpu_report.json").read_text())
    assert list(data["parts"]) == list(gpu_report.PARTS)
    assert not any(info["error"] for info in data["parts"].values())
    assert sum(info["seconds"] for info in data["parts"].values()) <= 60 + 15  # a last round may overrun
    records = data["records"]
    assert {r["part"] for r in records} == set(gpu_report.PARTS)
    for r in records:
        if r["part"] in gpu_report.TWO_GPU_PARTS:
            assert r["value"] is None and "two GPUs" in r["skip"], r
            continue
        assert r["skip"] is None, r
        assert isinstance(r["value"], (int, float)) and math.isfinite(r["value"]) and r["value"] > 0, r
        if r["goal"]:  # judged: met, or the shortfall named
            assert r["met"] is not None and (r["met"] or r["shortfall"]), r
        if r["baseline_name"]:
            assert r["baseline"] > 0, r
    names = {r["name"] for r in records}
    for kind in ("full", "lora", "mh_moe", "loramoe"):
        assert {f"train tokens/s {kind}", f"MFU {kind}"} <= names
    assert {"step time mh_moe / loramoe", "greedy generation tokens/s", "model/optimizer moves per stage",
            "step time vit_moe (image) / dense", "step time vit_moe (token) / dense",
            "step time vit_moe (image, grouped) / dense", "step time vit_moe (token, grouped) / dense",
            "full TRACE grid on one GPU (estimate)"} <= names
    assert {f"run {m}" for m in gpu_report.GRID} <= names
    # the static cache's pass is counted against the dynamic one's texts, and the grid estimate reads its rate
    static = next(r for r in records if r["name"] == "greedy generation tokens/s, static cache")
    assert "eager on the CPU" in static["note"] and "the dynamic cache's: " in static["note"], static
    assert all("(greedy generation tokens/s, static cache)'s rate" in r["note"]
               for r in records if r["name"].startswith("run "))

    table = rows((tmp_path / "gpu_report.md").read_text())
    assert len(table) == len(records)
    fmt = gpu_report.format_value
    for r in records:
        cells = table[(r["part"], r["name"])]
        assert cells[1:7] == [fmt(r["value"]), r["unit"], fmt(r["baseline"]), r["baseline_name"] or "-",
                              fmt(r["ratio"]), r["goal"] or "-"], (cells, r)
        assert cells[7] == ("skipped: " + r["skip"] if r["skip"] else "met" if r["met"] else
                            f"not met ({r['shortfall']})" if r["met"] is False else "-")

    # One part again, with no time for it: it measures the warm-up round and says so; its
    # records are replaced, the other parts' kept.
    again = report(tmp_path, "--only", "vit", "--budget-s", "0.01")
    assert again.returncode == 0, again.stderr[-3000:]
    merged = json.loads((tmp_path / "gpu_report.json").read_text())
    assert list(merged["parts"]) == list(gpu_report.PARTS) and merged["parts"]["vit"]["out_of_budget"]
    assert [r for r in merged["records"] if r["part"] != "vit"] == [r for r in records if r["part"] != "vit"]
    vit = [r for r in merged["records"] if r["part"] == "vit"]
    assert [r["name"] for r in vit] == [r["name"] for r in records if r["part"] == "vit"]
    assert all(isinstance(r["value"], float) for r in vit)
    assert all("only the warm-up round" in r["note"] for r in vit if r["ratio_rounds"])
    assert "the budget ran out" in (tmp_path / "gpu_report.md").read_text()


def test_out_must_be_a_folder(tmp_path):
    target = tmp_path / "file"
    target.write_text("keep")
    done = report(target)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"clbench: error: --out: {target} is a file; give a folder (it is "
                                                f"created if missing)"]
    assert target.read_text() == "keep"


def test_two_gpu_figures_become_records():
    gpu_report = load_script()
    side = {"tokens_per_s": 100.0, "resident_bytes": 2**20, "step_peak_bytes": 3 * 2**20}
    figures = {"world": 2, "ratios": [1.3, 1.1, 1.2], "ddp": side,
               "fsdp": {"tokens_per_s": 80.0, "resident_bytes": 2**19, "step_peak_bytes": 2**21}}
    rate, memory = gpu_report.fsdp_records(figures)
    assert (rate.value, rate.baseline, rate.ratio, rate.ratio_rounds) == (80.0, 100.0, 1.2, [1.3, 1.1, 1.2])
    assert (memory.value, memory.baseline, memory.ratio) == (2.5, 4.0, 0.625)  # resident + step peak, MiB


def test_a_cut_command_keeps_the_parts_it_finished(tmp_path):
    """SIGTERM (a lease's time limit) inside a part: the report holds the finished parts' figures, the cut
    part and the ones after it each say why they have none."""
    gpu_report = load_script()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(tmp_path)], cwd=ROOT,
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for line in process.stdout:  # the first part is written when the second starts
            if line.startswith("[gpu_report] generation:"):
                process.send_signal(signal.SIGTERM)
                break
        assert process.wait(timeout=120) == 124
    finally:
        process.kill()
    data = json.loads((tmp_path / "gpu_report.json").read_text())
    by_part = {}
    for r in data["records"]:
        by_part.setdefault(r["part"], []).append(r)
    assert by_part["lm_train"] and all(r["value"] is not None for r in by_part["lm_train"])
    assert [r["skip"].split(":")[0] for r in by_part["generation"]] == ["cut"]
    assert data["parts"]["generation"]["error"] == "cut by SIGTERM"
    for later in gpu_report.PARTS[2:]:
        assert [r["skip"] for r in by_part[later]] == ["not run: the command was stopped before it"]
    assert "cut by SIGTERM" in (tmp_path / "gpu_report.md").read_text()


def test_a_new_path_that_fails_leaves_the_parts_other_records_and_a_strict_mode_refusal_is_raised_on():
    """The static cache or the grouped ViT-MoE dispatch failing (as a GPU might refuse them)
    costs its own records only: the dynamic cache's generation and the looping dispatch are
    still measured. A refusal of deterministic mode is raised on, so that the part reruns
    without it, as a part's failure does."""
    from types import SimpleNamespace
    from unittest import mock

    import pytest
    import torch

    gpu_report = load_script()
    strict = SimpleNamespace(sync=lambda: None, deterministic=True)

    def refused():
        raise RuntimeError("index_add_ does not have a deterministic implementation")

    with pytest.raises(RuntimeError, match="deterministic"):
        gpu_report.first_pass(strict, refused)
    assert gpu_report.first_pass(SimpleNamespace(sync=lambda: None, deterministic=False), refused) == (
        None, "RuntimeError: index_add_ does not have a deterministic implementation")

    torch.set_num_threads(1)
    ctx = gpu_report.Context("cpu", gpu_report.PROFILES["cpu"], False, [])
    ctx.budget = gpu_report.Budget(60)
    with mock.patch("clbench.objectives.causal_lm.static_cache", side_effect=RuntimeError("no static cache\ndetail")):
        records = gpu_report.part_generation(ctx)
    dynamic, static = records
    assert dynamic.name == "greedy generation tokens/s" and dynamic.value > 0 and dynamic.skip is None
    assert static.value is None and static.skip == "error: RuntimeError: no static cache"
    # the grouped ViT-MoE dispatch likewise: its two step records say why, the loop's are measured
    ctx.budget = gpu_report.Budget(60)
    with mock.patch("torch.nn.functional.grouped_mm", side_effect=RuntimeError("no grouped product")):
        vit = {r.name: r for r in gpu_report.part_vit(ctx)}
    for level in ("image", "token"):
        assert vit[f"step time vit_moe ({level}, grouped) / dense"].skip == "error: RuntimeError: no grouped product"
        assert vit[f"step time vit_moe ({level}) / dense"].value > 0
