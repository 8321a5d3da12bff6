"""``clbench run`` end to end on each miniature vision stream: a valid result.json, or one error line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dataset_layouts import write_cifar10, write_core50, write_office_home

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def run(tmp_path: Path, benchmark: dict, *, model: str = "mlp", num_workers: int = 0) -> subprocess.CompletedProcess:
    cfg = {
        "seed": 0,
        "benchmark": benchmark,
        "model": {"class_path": model, "init_args": {"hidden": 32} if model == "mlp" else {}},
        "strategy": {"class_path": "naive"},
        "train": {"epochs": 1, "batch_size": 16, "eval_batch_size": 64, "num_workers": num_workers,
                  "optimizer": {"class_path": "adamw", "init_args": {"lr": 0.001}}},
        "trainer": {"accelerator": "cpu", "devices": 1},
        "logging": {"tensorboard": False, "progress": False},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return subprocess.run([sys.executable, "-m", "clbench.cli.main", "run", "--config", str(path), "--output",
                           str(tmp_path / "out"), "--no-progress"], capture_output=True, text=True, cwd=REPO,
                          timeout=600)


def result_of(tmp_path: Path, proc: subprocess.CompletedProcess, names: list[str], num_classes: int) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["status"] == "ok" and result["experiences"] == names
    assert result["benchmark"]["num_classes"] == num_classes
    r = result["r_matrix"]
    assert len(r) == len(names) and all(len(row) == len(names) for row in r)
    assert all(0.0 <= v <= 1.0 for row in r for v in row)
    return result


def test_core50_domains(tmp_path):
    root = write_core50(tmp_path / "data", sessions=[1, 2, 3], objects=[1, 2, 6], frames=5)
    proc = run(tmp_path, {"class_path": "clbench.benchmarks.core50:core50",
                          "init_args": {"root": str(root), "sessions": [1, 2, 3], "objects": [1, 2, 6],
                                        "image_size": 8}}, model="cnn")
    result_of(tmp_path, proc, ["s1", "s2", "s3"], 3)


def test_office_home(tmp_path):
    base = write_office_home(tmp_path / "data", domains=["Art", "Clipart"], classes=["Bed", "Mug", "Pen"],
                             per_class=5)
    proc = run(tmp_path, {"class_path": "clbench.benchmarks.office_home:office_home",
                          "init_args": {"root": str(base), "domains": ["art", "clipart"],
                                        "classes": ["Bed", "Mug", "Pen"], "image_size": 8}})
    result_of(tmp_path, proc, ["art", "clipart"], 3)


def test_cifar10_dirichlet_with_global_test(tmp_path):
    base = write_cifar10(tmp_path / "data", train_per_class=30, test_per_class=10)
    proc = run(tmp_path, {"class_path": "clbench.benchmarks.cifar10:cifar10_dirichlet",
                          "init_args": {"root": str(base), "num_experiences": 3, "min_size": 10, "image_size": 16}})
    result = result_of(tmp_path, proc, ["part0", "part1", "part2"], 10)
    assert "global_test" in result


def test_corrupt_image_met_by_a_loader_worker_is_one_error_line(tmp_path):
    root = write_core50(tmp_path / "data", sessions=[1, 2], objects=[1, 2], frames=5)
    bad = root / "core50_128x128" / "s1" / "o2" / "C_01_02_003.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    proc = run(tmp_path, {"class_path": "clbench.benchmarks.core50:core50",
                          "init_args": {"root": str(root), "sessions": [1, 2], "objects": [1, 2], "image_size": 8}},
               num_workers=1)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("clbench: error:")]
    assert len(lines) == 1 and str(bad) in lines[0] and "cannot decode" in lines[0]
