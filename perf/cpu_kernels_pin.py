"""What pinning the CPU kernels costs: the same work with kernels pinned (``--level``, default avx2)
against this CPU's native choice.

The level is fixed once per process (clbench.cpu_kernels), so the two cannot share one
process: each round starts both as fresh processes, back to back, in alternating order, and
prints the per-round ratio pinned / native and their median. Two workloads:

- ``naive``: ``perf/naive_overhead.py --rounds 1`` (clbench, a plain loop and Avalanche training
  naive on the digits stream), timed as a whole process;
- ``lm``: ``clbench run`` of ``configs/examples/trace-mini-seq_ft.yaml`` (a tiny Qwen3 trained and
  evaluated on trace-mini), timed by the run itself (``compute.wall_seconds``: no interpreter start).

On a CPU whose native level is the pinned one (an AVX2 machine pinned to avx2) only MKL's and
oneDNN's pins differ; on an AVX-512 machine the pin also gives up ATen's AVX-512 kernels.

    python perf/cpu_kernels_pin.py [--rounds 3] [--level avx2] [--only naive lm]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")


def _naive(level: str, scratch: Path) -> float:
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_VARIABLES}
    if level != "native":
        from clbench.cpu_kernels import LEVELS

        env.update(LEVELS[level])
    start = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "perf" / "naive_overhead.py"), "--rounds", "1"], cwd=ROOT, env=env,
                   check=True, capture_output=True)
    return time.perf_counter() - start


def _lm(level: str, scratch: Path) -> float:
    out = scratch / f"lm-{level}-{time.monotonic_ns()}"
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_VARIABLES}
    subprocess.run([sys.executable, "-m", "clbench.cli.main", "run", "--config",
                    str(ROOT / "configs" / "examples" / "trace-mini-seq_ft.yaml"), "--output", str(out),
                    "--no-progress", "--cpu-kernels", level], cwd=ROOT, env=env, check=True, capture_output=True)
    result = json.loads((out / "result.json").read_text())
    pin = result["env"]["cpu"]["pin"]
    assert pin == (None if level == "native" else level), f"the run recorded pin {pin!r}, asked {level}"
    return result["compute"]["wall_seconds"]


WORKLOADS = {"naive": _naive, "lm": _lm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--level", default="avx2", choices=["default", "avx2", "avx512"])
    parser.add_argument("--only", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    args = parser.parse_args()
    from clbench.results.assemble import cpu_identity

    cpu = cpu_identity()
    print(f"CPU {cpu['model']}, native level {cpu['isa']}; pinned level {args.level}; {args.rounds} rounds")
    with tempfile.TemporaryDirectory(prefix="clbench-pin.") as scratch:
        for name in args.only:
            measure, ratios = WORKLOADS[name], []
            for k in range(args.rounds):
                order = (args.level, "native") if k % 2 == 0 else ("native", args.level)
                seconds = {level: measure(level, Path(scratch)) for level in order}
                ratios.append(seconds[args.level] / seconds["native"])
                print(f"{name} round {k + 1}: pinned {seconds[args.level]:.2f} s, native {seconds['native']:.2f} s, "
                      f"ratio {ratios[-1]:.3f}", flush=True)
            print(f"{name}: pinned / native, median of {len(ratios)} rounds: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
