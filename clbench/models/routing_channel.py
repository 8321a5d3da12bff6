"""The channel MoE layers report routing through: one call per forward, free unless recording.

A layer reports each forward's routing decisions; a recorder (what listens:
:class:`clbench.metrics.routing.RoutingRecorder`, driven in a run by the
:class:`clbench.metrics.routing_recording.RoutingRecording` callback) says which domain the forwards
belong to. Models import this module and nothing of :mod:`clbench.metrics`::

    from clbench.models import routing_channel as routing

    class MoELayer(nn.Module):
        records_routing = True          # lets RoutingRecorder.attach find the layer
        def __init__(self, dim, num_experts, k):
            ...
            self.num_experts = num_experts
        def forward(self, x):
            gates = self.router(x).softmax(-1)             # (..., E)
            top = gates.topk(self.k, dim=-1)               # indices (..., k)
            routing.record(self, experts=top.indices, gates=gates)
            ...

Arguments of :func:`record`: ``experts`` (integer top-k indices ``(..., k)``, also for k = 1),
``gates`` (router probabilities ``(..., E)``; their argmax is the decision when ``experts`` is
omitted), ``mask`` (bool over routing units, False to skip, e.g. padding tokens), ``subspace``
(one id per unit, for a layer whose experts run under one of several parameter subsets). The active
recording is held in a :mod:`contextvars` variable, so it follows the code that runs the
forward passes; nesting recordings restores the outer one on exit.

What the units are: a layer sees hidden states, not the batch, so it cannot tell padding from
text or a token's position. The code that runs the forward pass says so with :func:`units`
(``token_mask``/``token_labels`` of shape ``(B, T[, m])``, ``sample_labels`` ``(B, m)``); a
layer's ``record`` of ``B*T`` units (one per token, row-major) then drops masked tokens, and a
recorder counting compositions takes each unit's composition as ``(domain, *sample_labels,
*token_labels)``. ``B*(P+T)`` units are tokens behind a learned prefix of ``P`` positions
(MoSEs' task prompt): the prefix is not counted. Any other multiple ``B*u`` (an image routed
per patch) gets the sample labels repeated per unit and no mask. :func:`paused` stops recording
for forwards that are not the units to count (the decoding steps of a generation, whose tokens
depend on the model itself). Importing this module loads torch only.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any, Iterator, Protocol

import torch
from torch import Tensor, nn


class Sink(Protocol):
    """What receives the records of an active recording (a recorder)."""

    def log(self, layer: Any, *, domain: int, **routing: Any) -> None: ...


_ACTIVE: contextvars.ContextVar[tuple[Sink, int] | None] = contextvars.ContextVar(
    "clbench_routing_active", default=None)
_UNITS: contextvars.ContextVar["UnitLayout | None"] = contextvars.ContextVar("clbench_routing_units", default=None)


@dataclass(frozen=True)
class UnitLayout:
    """What the routing units of the forwards in a :func:`units` block are (see the module notes)."""

    token_mask: Tensor | None = None     # (B, T) bool: False for padding
    token_labels: Tensor | None = None   # (B, T, m) integer labels per token
    sample_labels: Tensor | None = None  # (B, m) integer labels per sample

    @property
    def label_width(self) -> int:
        """How many labels every unit of these forwards has (sample labels, then token labels)."""
        return sum(t.shape[-1] for t in (self.sample_labels, self.token_labels) if t is not None)

    def resolve(self, n: int) -> tuple[Tensor | None, Tensor | None]:
        """(mask (n,), labels (n, m)) for a record of ``n`` units; None where they do not apply."""
        tokens = self.token_mask if self.token_mask is not None else self.token_labels
        samples = self.sample_labels
        batch = tokens.shape[0] if tokens is not None else samples.shape[0] if samples is not None else 0
        if not batch:
            return None, None
        per = n // batch if n % batch == 0 else 0
        if tokens is not None and per >= tokens.shape[1]:
            # ``per - T`` leading positions per sample are a learned prefix (prompt tuning): not counted
            extra = per - tokens.shape[1]
            mask = self.token_mask.bool() if self.token_mask is not None else None
            if extra:
                mask = torch.ones(tokens.shape[:2], dtype=torch.bool, device=tokens.device) if mask is None else mask
                mask = torch.cat([mask.new_zeros(batch, extra), mask], 1)
            parts = [] if samples is None else [samples.long().repeat_interleave(per, 0)]
            if self.token_labels is not None:
                labels = self.token_labels.long().to(tokens.device)
                labels = torch.cat([labels.new_zeros(batch, extra, labels.shape[-1]), labels], 1) if extra else labels
                parts.append(labels.reshape(n, -1))
            return (None if mask is None else mask.reshape(n)), (torch.cat(parts, 1) if parts else None)
        if samples is not None and n % batch == 0:
            return None, samples.long().repeat_interleave(n // batch, 0)
        return None, None


@contextlib.contextmanager
def units(*, token_mask: Tensor | None = None, token_labels: Tensor | None = None,
          sample_labels: Tensor | None = None) -> Iterator[None]:
    """Describe the routing units of the forward passes inside the block (module notes)."""
    def rows(t: Tensor | None, dims: int) -> Tensor | None:
        if t is None:
            return None
        t = t.detach()
        return t.unsqueeze(-1) if t.ndim == dims - 1 else t

    if token_mask is not None and token_mask.ndim != 2:
        raise ValueError(f"token_mask must have shape (B, T), got {tuple(token_mask.shape)}")
    token = _UNITS.set(UnitLayout(token_mask=None if token_mask is None else token_mask.detach(),
                                  token_labels=rows(token_labels, 3), sample_labels=rows(sample_labels, 2)))
    try:
        yield
    finally:
        _UNITS.reset(token)


def token_mask(batch: int, length: int) -> Tensor | None:
    """The active :func:`units` block's token mask when it describes ``batch`` samples of
    ``length`` tokens (True for text, False for padding); None otherwise. For a layer's own
    per-sample sums (LoRAMoE's balancing term), which should not count padding either."""
    layout = _UNITS.get()
    mask = None if layout is None else layout.token_mask
    return mask.bool() if mask is not None and tuple(mask.shape) == (batch, length) else None


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No routing is recorded inside the block, even within a recorder's ``domain``."""
    token = _ACTIVE.set(None)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


class _Discard:
    def log(self, layer: Any, **kwargs: Any) -> None:
        pass


@contextlib.contextmanager
def discarded() -> Iterator[None]:
    """Inside a recorder's ``domain``: layers route as if recorded (the same work, the same
    collectives under sharded parameters) and the records are dropped. Elsewhere: nothing."""
    if _ACTIVE.get() is None:
        yield
        return
    token = _ACTIVE.set((_Discard(), 0))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def record(layer: nn.Module | str, *, experts: Tensor | None = None,
           gates: Tensor | None = None, mask: Tensor | None = None,
           num_experts: int | None = None, subspace: Tensor | None = None) -> None:
    """Report one forward's routing decisions; a no-op unless a recorder's ``domain`` is active.

    ``subspace`` (one id per unit) names the parameter subset the experts ran under when a
    layer has several (MoSEs: the task whose masks its key chose): it is part of each unit's
    route, since expert j under two tasks' masks is two different functions."""
    active = _ACTIVE.get()
    if active is None:
        return
    recorder, domain = active
    recorder.log(layer, experts=experts, gates=gates, mask=mask, num_experts=num_experts,
                 domain=domain, subspace=subspace)


def is_recording() -> bool:
    """True inside a recording: lets a layer skip work done only for metrics."""
    return _ACTIVE.get() is not None


@contextlib.contextmanager
def recording_into(sink: Sink, domain: int) -> Iterator[None]:
    """Send the records of the forwards inside the block to ``sink``, attributed to ``domain``
    (what :meth:`clbench.metrics.routing.RoutingRecorder.domain` opens)."""
    token = _ACTIVE.set((sink, int(domain)))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def current_units() -> UnitLayout | None:
    """The innermost :func:`units` block's layout (None outside any)."""
    return _UNITS.get()
