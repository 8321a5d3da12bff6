"""Losses from inside the model: how a layer adds to the training loss.

A layer (built into the model or injected later by a strategy) adds a term during its
forward pass with one call; the term joins the loss that is back-propagated and is logged
under its name. Outside a training step the call does nothing, so evaluation and plain use of
the model cost nothing::

    from clbench.models import auxiliary

    class MoELayer(nn.Module):
        def forward(self, x):
            gates = self.router(x).softmax(-1)
            auxiliary.add("balance", self.balance_weight * balance_loss(gates))
            ...

Terms of the same name from several layers are summed. The layer applies its own weight:
the collector adds terms as given. The active collection lives in a :mod:`contextvars`
variable, so it follows the code that runs the forward pass, whichever module that is; no
layer has to be registered, and layers that appear between experiences take part at once.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

from torch import Tensor

_ACTIVE: contextvars.ContextVar[dict[str, Tensor] | None] = contextvars.ContextVar(
    "clbench_auxiliary_losses", default=None)


def add(name: str, value: Tensor) -> None:
    """Add ``value`` (a scalar tensor with its graph) to the training loss, logged as ``name``."""
    terms = _ACTIVE.get()
    if terms is None:
        return
    if value.dim() != 0:
        raise ValueError(f"auxiliary loss {name!r} must be a scalar, got shape {tuple(value.shape)}")
    terms[name] = terms[name] + value if name in terms else value


def is_collecting() -> bool:
    return _ACTIVE.get() is not None


@contextlib.contextmanager
def collect() -> Iterator[dict[str, Tensor]]:
    """Collect the terms added by forward passes inside the block (name -> summed term)."""
    terms: dict[str, Tensor] = {}
    token = _ACTIVE.set(terms)
    try:
        yield terms
    finally:
        _ACTIVE.reset(token)
