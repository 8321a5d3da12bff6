"""perf/mkl_branches.py: each MKL branch gives the same digests in every fresh process, and the
branches a level may pin compute different bits, so comparing two vendors' digests can tell them apart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clbench import cpu_kernels

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif("avx2" not in cpu_kernels.available(), reason="the branches are pinned on x86-64 CPUs with AVX2")
def test_a_branch_gives_the_same_bits_in_every_process_and_branches_differ():
    done = subprocess.run([sys.executable, str(ROOT / "perf" / "mkl_branches.py"), "--repeat", "1",
                           "--branches", "COMPATIBLE", "AVX2", "COMPATIBLE"],
                          capture_output=True, text=True, timeout=300, check=True)
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| COMPATIBLE") or
            line.startswith("| AVX2")]
    assert [row[0] for row in rows] == ["| COMPATIBLE", "| AVX2", "| COMPATIBLE"], done.stdout
    first, avx2, again = (row[1:6] for row in rows)
    assert first == again and all(len(d) == 8 for d in first)  # reproducible: what a comparison rests on
    # the control: the pinned AVX2 level's branch is not COMPATIBLE's (on an Intel CPU MKL's AVX2
    # kernels, elsewhere its automatic branch), so equal digests across vendors would mean something
    assert first[0] != avx2[0], done.stdout
