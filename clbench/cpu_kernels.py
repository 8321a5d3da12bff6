"""The CPU kernels a run computes with, pinned so that a result reruns bit-exactly on another x86 CPU.

A CPU process picks its kernels by instruction set, once: ATen's own vectorised kernels
(``ATEN_CPU_CAPABILITY``: ``default``, ``avx2``, ``avx512``), MKL's BLAS (``MKL_CBWR``, its
conditional numerical reproducibility) and oneDNN's primitives (``ONEDNN_MAX_CPU_ISA``). An AVX2
and an AVX-512 machine therefore round the same run differently, and a top-k router or a greedy
decoder can turn a last-bit difference into another answer. Pinning all three to one level gives
the same floats on every CPU of one vendor that has it (same torch build and thread count;
below); AVX2 (with FMA) is
the level every x86-64 CPU of the last decade has (:data:`PORTABLE`). ``native`` pins nothing.

A pin is bit-exact within one CPU vendor only. MKL's ISA branches (``MKL_CBWR=AVX2``,
``AVX512``) are Intel's own: on another vendor's CPU MKL ignores them and takes its automatic
branch for that CPU; only ``COMPATIBLE`` (SSE2 without the approximate reciprocals) is documented
to run the same on every vendor (Intel's oneMKL developer guide, "Getting Started with
Conditional Numerical Reproducibility"). Measured with ``perf/mkl_branches.py`` on an Intel Xeon,
natively and under ``qemu-x86_64 -cpu EPYC-Milan-v1`` (the same binary seeing an AMD CPU): fp32
and fp64 matmuls and attention under ``AVX2`` give other bits on the two vendors, under
``COMPATIBLE`` the same, though an MLP trained 100 Adam steps still ended with other weights
there (not isolated: another kernel, or the emulator). The committed entries pinned to AVX2 on
AMD EPYCs reran on the Intel Xeon with other bits: last-bit differences where the method
converges (8e-15 in a float64 regression), beyond the test set's noise where it does not (naive
fine-tuning's old tasks, GDumb). So the CPU class an entry reruns exactly on is (vendor, level)
(:func:`exact_across`). ``COMPATIBLE`` costs a fp32 matmul about 2.6 times AVX2's (15.1 against
5.8 ms for 256x1024 by 1024x1024 on that Xeon) with no measured promise of equal runs, so no level
takes it but ``default``.

What each pin holds apart, measured on this code's torch build (an AVX2 EPYC): ATen's level
changes reductions, activations and layer norms (``default`` against ``avx2``); ``MKL_CBWR=AVX2``
changes nothing in a plain matmul there but changes scaled-dot-product attention (its blocked
GEMMs), which is why a ViT differs across CPU classes with ATen alone pinned; oneDNN caps its
convolutions' JIT kernels. oneDNN may still choose blockings by cache size, which no variable
pins; an entry whose rerun differs under the pin is judged against its test set's noise
(:mod:`clbench.leaderboard.verify`).

The level is fixed when a process first computes, after which setting the variables changes
nothing, and only ATen's can be read back. So :func:`pin` sets them only before torch is
imported (the ``clbench`` command and the worker processes do, first thing); a process that
imported torch already is pinned only if it was started so. The caller decides what else to do:
a suite run in such a process records the level it really ran with, ``verify`` reruns in a fresh
process. Children (data-loader workers, DDP ranks) inherit the variables. What a process
computed with is read back from its environment (:func:`pinned_level`), never more than true.
"""

from __future__ import annotations

import os
import platform
import sys
from functools import lru_cache

from clbench.errors import UserError

NATIVE = "native"
PORTABLE = "avx2"  # a suite's default where the CPU has it (portable_default)
#: level -> the variables that pin it. ``default`` is ATen's scalar fallback (any x86-64 CPU).
LEVELS: dict[str, dict[str, str]] = {
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
}
VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")
#: the CPU flags (``/proc/cpuinfo``) each level needs; ATen's own test (AVX-512: F, BW, VL, DQ).
NEEDS = {"default": (), "avx2": ("avx2", "fma"), "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq")}


#: MKL branches that MKL runs the same way on every vendor's CPU (the module notes).
VENDOR_NEUTRAL_MKL = frozenset({"COMPATIBLE"})
#: A CPU model name's vendor, for entries recorded before ``env.cpu.vendor`` was.
_VENDOR_IN_MODEL = {"AMD": "AuthenticAMD", "Intel": "GenuineIntel"}


@lru_cache(maxsize=1)
def cpu_vendor() -> str | None:
    """This CPU's vendor as the CPU names itself (``GenuineIntel``, ``AuthenticAMD``; Linux's
    ``/proc/cpuinfo`` ``vendor_id``), None where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.startswith("vendor_id")), None)
    except OSError:
        return None


def vendor_of(cpu: dict | None) -> str | None:
    """The vendor a recorded ``env.cpu`` computed on: recorded, else read off its model name
    (``AMD EPYC`` -> ``AuthenticAMD``); None where neither tells."""
    cpu = cpu if isinstance(cpu, dict) else {}
    if isinstance(cpu.get("vendor"), str):
        return cpu["vendor"]
    model = cpu.get("model") if isinstance(cpu.get("model"), str) else ""
    return next((vendor for word, vendor in _VENDOR_IN_MODEL.items() if word in model.split()), None)


def exact_across(level: str | None, made: dict | None, rerun: dict | None) -> bool:
    """Whether a run pinned to ``level`` on the CPU ``made`` (its ``env.cpu``) computes the same
    floats on the CPU ``rerun``: at a level whose MKL branch is vendor-neutral, on any CPU with
    the level; at another, only on a CPU of the same (known) vendor."""
    if level not in LEVELS:
        return False
    if LEVELS[level]["MKL_CBWR"] in VENDOR_NEUTRAL_MKL:
        return True
    return vendor_of(made) is not None and vendor_of(made) == vendor_of(rerun)


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (Linux: ``/proc/cpuinfo``; elsewhere none are known)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return frozenset(next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), []))
    except OSError:
        return frozenset()


def x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def available() -> list[str]:
    """The levels this CPU can compute at, lowest first (none to pin off x86-64)."""
    if not x86():
        return []
    return [level for level, flags in NEEDS.items() if all(flag in cpu_flags() for flag in flags)]


def portable_default() -> str:
    """A suite's level when it names none: :data:`PORTABLE` where this CPU has it, else ``native``
    (an ARM laptop, a pre-AVX2 CPU: nothing to pin that another CPU class shares)."""
    return PORTABLE if PORTABLE in available() else NATIVE


def check_level(value, *, where: str) -> str:
    """``native`` or a level this CPU has, else a one-line :class:`UserError`."""
    choices = [NATIVE, *LEVELS]
    if not isinstance(value, str) or value.lower() not in choices:
        raise UserError(f"unknown CPU kernel level {value!r}", where=where, fix=f"use one of {', '.join(choices)}")
    value = value.lower()
    if value != NATIVE and value not in available():
        have = ", ".join(available()) or f"none: this is a {platform.machine()} CPU"
        raise UserError(f"this CPU cannot compute at level {value} (levels it has: {have})", where=where,
                        fix=f"use {NATIVE}, or run where the CPU has {value}")
    return value


def in_effect() -> str:
    """The level ATen computes at in this process (``avx2``, ``avx512``, ``default``, ...); reading
    it fixes it, as a first tensor operation would."""
    import torch

    return torch.backends.cpu.get_cpu_capability().lower()


def pin(variables: dict[str, str]) -> bool:
    """Whether this process computes under ``variables`` (a level's, :data:`LEVELS`; ``{}``: none):
    set here, for it and its children, while torch is not imported yet (nothing can have computed);
    afterwards only true if the process was started so. So a pin is never claimed that MKL or
    ATen, already initialised, would not honour."""
    if "torch" not in sys.modules:
        for name in VARIABLES:
            os.environ.pop(name, None)
        os.environ.update(variables)
        return True
    return computes_as(variables)


def pin_level(level: str) -> bool:
    """:func:`pin` a level by name; ``native`` pins nothing (and is always in effect)."""
    return True if level == NATIVE else pin(LEVELS[level])


def pin_for_run(level, *, where: str) -> None:
    """A single run's pin (``clbench run --cpu-kernels``, ``clbench.run(cpu_kernels=)``), checked;
    a process that already computes at another level cannot take it: one line saying so."""
    level = check_level(level, where=where)
    if level != NATIVE and pinned_level() != level and not pin_level(level):
        raise UserError(f"this process already computes with {in_effect()} kernels, and the level is fixed by its "
                        "first tensor operation", where=where,
                        fix=f"pin before using torch (a new Python process), or use {NATIVE}")


def pinned_level() -> str | None:
    """The level this process computes at if all three of its variables pin it, else None."""
    for level, variables in LEVELS.items():
        if all(os.environ.get(name) == value for name, value in variables.items()):
            return level if in_effect() == variables["ATEN_CPU_CAPABILITY"] else None
    return None


def rerun_variables(cpu: dict | None) -> dict[str, str]:
    """The variables that make a rerun compute as a recorded run did (its ``env.cpu``): its pinned
    level's three; for a run that pinned nothing, ATen's level alone, as it recorded it (``isa``);
    nothing where neither is recorded."""
    cpu = cpu if isinstance(cpu, dict) else {}
    level = cpu.get("pin")
    if isinstance(level, str) and level in LEVELS:
        return dict(LEVELS[level])
    isa = cpu.get("isa")
    if isinstance(isa, str) and isa.lower() in LEVELS:
        return {"ATEN_CPU_CAPABILITY": isa.lower()}
    return {}


def computes_as(variables: dict[str, str]) -> bool:
    """Whether this process already computes as ``variables`` ask (nothing asked: any process does):
    ATen at their level (set by the variable or chosen by this CPU), MKL and oneDNN pinned exactly
    as they say, or unpinned where they say nothing."""
    if not variables:
        return True
    if any(os.environ.get(name) != variables.get(name) for name in VARIABLES if name != "ATEN_CPU_CAPABILITY"):
        return False
    return in_effect() == variables["ATEN_CPU_CAPABILITY"]
