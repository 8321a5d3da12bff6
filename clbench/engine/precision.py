"""The numeric precision a run computes in, when its config does not say.

A language model on a CPU with bf16 matrix units (AVX-512 BF16 or AMX: ``avx512_bf16`` /
``amx_bf16`` in ``/proc/cpuinfo``) trains and generates under Lightning's ``bf16-mixed``: fp32
weights, optimizer states and loss, matmuls in bf16 through ``torch.autocast("cpu")``. Where
the CPU lacks those units a bf16 matmul is emulated and slower than fp32, so the default stays
``32-true``. ``trainer.precision`` in a config always wins; the precision a run used is
recorded in its result (``env.precision``) and its checkpoints; a resumed run goes on in its
checkpoint's precision and ``clbench leaderboard verify`` reruns an entry in the precision it
records (:func:`pinned`), whatever this CPU would pick. The environment
variable ``CLBENCH_CPU_BF16=0`` keeps fp32 on any CPU (the test suite sets it, so that its
numbers do not depend on the machine).

Why autocast and not a frozen bf16 base with fp32 adapters: autocast is correct for every
method the harness has, full fine-tuning and replay included (their weights stay fp32, so an
update smaller than bf16's resolution is not lost), and it is Lightning's own path, so the
reference models and pre-training stages get it too. A bf16 base would save the per-step cast
of the frozen weights, which ``perf/cpu_bf16.py`` measures, but only for adapter methods. In a
pooled decode the casts are kept instead (:func:`casts_kept`): each weight is cast once a pass.

Only language-model runs (an objective that ``provides`` ``language_model``) get the bf16
default (our choice): their matmuls are large enough for the units to pay; the vision suites'
models are small and their committed numbers are fp32.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

BF16_FLAGS = ("amx_bf16", "avx512_bf16")
BF16_MIXED = "bf16-mixed"
ENV_SWITCH = "CLBENCH_CPU_BF16"  # "0": never default to bf16
_PINNED: ContextVar[str | None] = ContextVar("clbench_pinned_precision", default=None)


def cpu_bf16_units() -> bool:
    """Whether this CPU has bf16 matrix units (its flags: :func:`clbench.cpu_kernels.cpu_flags`)
    that the kernels in effect use: kernels pinned below AVX-512 (``--cpu-kernels avx2``) emulate
    bf16 matmuls, and a pinned bf16 run of the tiny trace-mini Qwen3 took 2.9 times as long as a
    native one on an AVX-512 EPYC with bf16 units (``perf/cpu_kernels_pin.py``), so there the
    default stays fp32."""
    from clbench import cpu_kernels

    has_units = any(flag in cpu_kernels.cpu_flags() for flag in BF16_FLAGS)
    return has_units and cpu_kernels.in_effect().startswith("avx512")


@contextmanager
def pinned(precision: str) -> Iterator[None]:
    """Runs started inside default to ``precision`` on the CPU (a recorded entry's, when it is rerun)."""
    token = _PINNED.set(precision)
    try:
        yield
    finally:
        _PINNED.reset(token)


@contextmanager
def pinning() -> Iterator[Callable[[str], None]]:
    """A scope in which a precision can be pinned once it is known: a resumed run's, read from its
    checkpoint (:func:`saved_precision`), so that its later stages compute as its first did."""
    tokens = []
    try:
        yield lambda precision: tokens.append(_PINNED.set(precision))
    finally:
        for token in reversed(tokens):
            _PINNED.reset(token)


def saved_precision(ckpt: dict) -> str:
    """The precision a checkpointed run computed in (one saved before it was recorded: fp32)."""
    return (ckpt.get("settings") or {}).get("precision") or "32-true"


def default_precision(cfg: dict, source: str) -> str | None:
    """The Trainer precision for ``cfg`` when ``trainer.precision`` is unset: the pinned one, else
    ``bf16-mixed`` for a language-model run on a CPU with bf16 units, otherwise None (Lightning's
    default, fp32)."""
    from clbench.plugins.build import known_objective

    trainer = cfg.get("trainer") or {}
    if "precision" in trainer or trainer.get("accelerator") != "cpu":
        return None
    if _PINNED.get() is not None:
        return _PINNED.get()
    if os.environ.get(ENV_SWITCH) == "0" or not cpu_bf16_units():
        return None
    objective, _ = known_objective(cfg, source)
    if objective is None or "language_model" not in objective.provides:
        return None
    return BF16_MIXED


@contextmanager
def casts_kept(model) -> Iterator[None]:
    """Inside CPU autocast: each frozen weight cast to bf16 once for the span, not at every op.

    Autocast keeps the bf16 copy of a weight for the rest of its region only when the weight is
    a leaf that requires grad (torch's rule for its cast cache). An adapter method's frozen base
    therefore is cast again at every decoding step, and on a CPU the cast moves as many bytes as
    the bf16 matmul reads. A pooled decode (:mod:`clbench.objectives.generation_pool`) runs in
    one region, so the frozen floating-point parameters are marked as requiring grad for its
    span, under ``no_grad`` (no graph is built), and unmarked after. The cast is the same, so
    are the tokens; the copies (half the weights' bytes) live until the region ends. Measured by
    ``perf/autocast_casts.py``. Outside CPU autocast (fp32 runs, every committed leaderboard)
    nothing changes. CUDA autocast follows the same rule, but is not measured here, so it is left alone."""
    import torch

    if not torch.is_autocast_enabled("cpu"):
        yield
        return
    frozen = [p for p in model.parameters() if p.is_floating_point() and not p.requires_grad]
    try:
        with torch.no_grad():
            for p in frozen:
                p.requires_grad_(True)
            yield
    finally:
        for p in frozen:
            p.requires_grad_(False)
