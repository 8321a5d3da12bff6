"""When a rerun cannot be bit-exact, and how large its difference is against the test set's noise.

A CPU entry whose kernels were pinned (:mod:`clbench.cpu_kernels`), rerun at that level
and in fp32, gives the same floats on any CPU of its vendor that has the level: ``verify`` holds
it to equality. Other entries cannot promise that on another machine: one made on a GPU, one
made in bf16-mixed (matmuls on the CPU's bf16 units, or emulated where it has none), one whose
recorded level this CPU lacks, one made with unpinned kernels on another CPU model (MKL and
oneDNN chose by that CPU), or one pinned on another vendor's CPU (MKL's AVX2 and AVX-512
branches are Intel's own; elsewhere MKL takes its automatic branch:
:func:`~clbench.cpu_kernels.exact_across`). Their reruns are judged against each number's
test-set standard error instead: a difference of a fraction of one SE is rounding that the
sampling of the test set dwarfs.

The SE of a cell is the committed entry's (``r_stderr``, ``r_init_stderr``, ``scores_stderr``),
floored, where R is a share of test samples, at one sample's weight (1/n, from ``r_n``): a cell
at 0/100 or 100/100 has a binomial SE of 0, and a flip of one answer must not read as
infinitely many SEs. A number with no SE
recorded (the other metrics' matrices) is not judged; R's cells carry the primary metric.
"""

from __future__ import annotations

import math
from typing import Iterator

#: A rerun within this many standard errors of every committed number is "within noise".
NOISE_SE = 2.0


def why_not_exact(committed: dict, rerun: dict, at_recorded_level: bool) -> str | None:
    """Why a rerun of ``committed`` (its ``env``) on the machine of ``rerun`` (its ``env``) cannot be
    held to equality; None where it can."""
    cpu, here = committed.get("cpu") or {}, rerun.get("cpu") or {}
    same_cpu = cpu.get("model") == here.get("model") and cpu.get("isa") == here.get("isa")
    if committed.get("cuda"):
        return None if committed.get("device") == rerun.get("device") else f"made on a GPU ({committed.get('device')})"
    if not at_recorded_level:
        return f"made with {cpu.get('isa')} kernels, which this CPU lacks"
    if (committed.get("precision") or "32-true") != "32-true" and not same_cpu:
        return f"made in {committed.get('precision')} on another CPU (its bf16 matmuls are that CPU's)"
    pin = cpu.get("pin")
    if not pin:
        return None if same_cpu else "made with unpinned kernels on another CPU (MKL and oneDNN chose by that CPU)"
    from clbench.cpu_kernels import exact_across, vendor_of

    if not exact_across(pin, cpu, here):
        return (f"pinned to {pin} on a CPU of another vendor ({vendor_of(cpu) or 'not recorded'}, rerun on "
                f"{vendor_of(here) or 'unknown'}: MKL's {pin} branch is Intel's own, other CPUs take their own)")
    return None


def _cells(committed: dict, rerun: dict) -> Iterator[tuple[str, float, float, float, int | None]]:
    """(where, committed, rerun, SE, n) for every number that has a recorded SE."""
    counts = committed.get("r_n") or []  # None where a column's metric is no share of samples (a loss)
    for i, (row, new_row, se_row) in enumerate(zip(committed.get("r_matrix") or [], rerun.get("r_matrix") or [],
                                                   committed.get("r_stderr") or [])):
        for j, (a, b, se) in enumerate(zip(row, new_row, se_row or [])):
            yield f"R[{i}][{j}]", a, b, se, counts[j] if j < len(counts) else None
    for j, (a, b, se) in enumerate(zip(committed.get("r_init") or [], rerun.get("r_init") or [],
                                       committed.get("r_init_stderr") or [])):
        yield f"r_init[{j}]", a, b, se, counts[j] if j < len(counts) else None
    scores, new_scores = committed.get("scores") or {}, rerun.get("scores") or {}
    for key, se in sorted((committed.get("scores_stderr") or {}).items()):
        yield f"scores.{key}", scores.get(key), new_scores.get(key), se, min((c for c in counts if isinstance(c, int)),
                                                                             default=None)


def largest_in_se(committed: dict, rerun: dict) -> tuple[float, str | None]:
    """(the largest |difference| / SE over the numbers that have an SE, where); a number one side
    lacks, or whose SE is 0 with no floor, counts as infinitely many, and so does an entry with no
    SE recorded at all (nothing to judge the difference by)."""
    from clbench.metrics.score_registry import result_percent

    proportions = result_percent(committed)  # a share of test samples: one sample's weight is 1/n
    worst: tuple[float, str | None] = (0.0, None)
    for where, a, b, se, n in _cells(committed, rerun):
        if a is None and b is None:
            continue
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (a, b)):
            gap = math.inf
        else:
            floor = 1.0 / n if proportions and isinstance(n, int) and n > 0 else 0.0
            scale = max(se if isinstance(se, (int, float)) and math.isfinite(se) else 0.0, floor)
            diff = abs(float(a) - float(b))
            gap = 0.0 if diff == 0 else (diff / scale if scale > 0 else math.inf)
        if gap > worst[0] or worst[1] is None:
            worst = (gap, where)
    return worst if worst[1] is not None else (math.inf, "no number with a recorded standard error")
