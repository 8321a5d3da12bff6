"""The perf scripts that build a Trainer from a config with no stream run on a CPU with bf16 units
and on one without: the precision decision (clbench.engine.precision) must work for every config
the code builds. The CPU's flags are faked in the script's own process, both ways, with the
machine's bf16 default switched on (the rest of the test suite switches it off)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BF16_UNITS = "fpu sse2 avx2 fma avx512f avx512bw avx512vl avx512dq avx512_bf16 amx_bf16"
NO_BF16_UNITS = "fpu sse2 avx2 fma"
#: Runs a perf script as ``python SCRIPT ARGS`` would, on a CPU with the given flags.
FAKED = """
import runpy, sys
from clbench import cpu_kernels
cpu_kernels.cpu_flags = lambda: frozenset(sys.argv[1].split())
script = sys.argv[2]
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""


def _faked(flags: str, script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CLBENCH_CPU_BF16"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", FAKED, flags, str(ROOT / "perf" / script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_gpu_report_cpu_mode_and_lm_throughput_complete_on_a_cpu_with_bf16_units(tmp_path):
    """Where the units are, the decision reaches the objective lookup (where the config named no
    stream, it failed there); without them it stops before, which tests/test_gpu_report.py's
    whole CPU report and the test below cover."""
    flags = BF16_UNITS
    report = _faked(flags, "gpu_report.py", "--device", "cpu", "--only", "lm_train", "generation", "--budget-s", "1",
                    "--out", str(tmp_path), cwd=ROOT)
    assert report.returncode == 0, report.stderr[-3000:]
    parts = json.loads((tmp_path / "gpu_report.json").read_text())["parts"]
    assert not any(part["error"] for part in parts.values()), parts
    throughput = _faked(flags, "lm_throughput.py", "--steps", "2", "--gen-batches", "1", "--gen-new-tokens", "2",
                        "--rounds", "1", cwd=ROOT)
    assert throughput.returncode == 0, throughput.stderr[-3000:]
    assert "tokens/s" in throughput.stdout, throughput.stdout[-2000:]


def test_a_config_without_a_stream_gets_a_precision_on_either_cpu(monkeypatch):
    """What both scripts hand make_trainer: a trainer section and no benchmark (fp32: no objective is known)."""
    from clbench import cpu_kernels
    from clbench.engine import precision

    monkeypatch.delenv(precision.ENV_SWITCH, raising=False)
    for flags in (BF16_UNITS, NO_BF16_UNITS):
        monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda flags=flags: frozenset(flags.split()))
        assert precision.default_precision({"trainer": {"accelerator": "cpu", "devices": 1}}, "perf") is None
