"""Sharded parameters as models, objectives and strategies see them (FSDP2, applied by
:mod:`clbench.engine.sharding` to :func:`clbench.models.protocol.inner_model`). Kept on the
models' floor so that code below the engine can ask without importing it."""

from __future__ import annotations

from typing import Any

from torch import nn

from clbench.models.protocol import inner_model


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model``'s parameters are sharded across processes: generation then has to keep
    every rank decoding until all are done."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):  # sharding needs a process group
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(inner_model(model), FSDPModule)


def full(tensor: Any) -> Any:
    """A whole tensor from a sharded one (a collective), anything else unchanged."""
    if type(tensor).__name__ != "DTensor":  # without importing torch.distributed for plain tensors
        return tensor
    return tensor.full_tensor()
