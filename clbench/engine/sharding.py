"""Sharded parameters for language models: FSDP2 over the decoder blocks.

``trainer: {strategy: fsdp}`` runs a continual run under Lightning's ``ModelParallelStrategy``,
whose ``configure_model`` hook (:meth:`clbench.engine.module.ContinualModule.configure_model`) calls
:func:`shard_model` at the run's first ``fit`` or evaluation. FSDP2 (``fully_shard``) is used
rather than Lightning's ``FSDPStrategy`` (FSDP1) because it keeps every parameter a parameter
of its own (a ``DTensor`` sharded on dim 0) under its original name: a frozen base and
trainable adapters live in one unit without ``use_orig_params``, peft and the MoE adapters
keep addressing their weights by name, and ``requires_grad`` may change between experiences
(O-LoRA freezes each task's adapter). It also runs on a CPU device mesh with gloo, so the path
is tested without GPUs; ``FSDPStrategy`` refuses a CPU accelerator.

Layout: each decoder block (the classes a transformers model lists in ``_no_split_modules``,
the units its own FSDP and device-map code never split) is one unit; the transformers model is
the root unit (embeddings, final norm, head). The root is the module both training
(``model(**batch)``) and ``generate`` enter through, so its unshard hooks run in both. The
mesh is Lightning's: on one node (1, devices) shards over every process; on several nodes
(nodes, devices per node) it is hybrid sharding: sharded within a node, replicated across
nodes, gradients all-reduced between replicas. clbench applies no tensor parallelism.

Rule for strategies: every parameter must exist before the model is sharded (create them in
``adapt_model``, which the module calls for the whole stream just before sharding); parameters
added later would be neither sharded nor reduced, so :func:`check_unchanged` refuses them.
Changing ``requires_grad`` later is fine.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from clbench.errors import UserError
from clbench.models.sharded import is_sharded


def shard_root(model: nn.Module) -> nn.Module:
    """The module sharded as the root unit: the transformers model of a ``CausalLM``."""
    from clbench.models.protocol import inner_model

    return inner_model(model)




def block_classes(model: nn.Module) -> set[str]:
    root = shard_root(model)
    blocks = set(getattr(root, "_no_split_modules", None) or [])
    if not blocks:
        raise UserError(f"{type(root).__name__} names no transformer blocks to shard (no _no_split_modules)",
                        where="trainer.strategy",
                        fix="use trainer.strategy: ddp, or a transformers causal LM (model: hf_causal_lm)")
    return blocks


def shard_model(model: nn.Module, mesh: Any) -> dict[int, nn.Parameter]:
    """Apply ``fully_shard`` to every decoder block, then to the root; returns ``{id(old
    parameter): new parameter}`` (sharding replaces each parameter object by a DTensor one)."""
    from torch.distributed.fsdp import fully_shard

    root = shard_root(model)
    inside = {id(p) for p in root.parameters()}
    outside = [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in inside]
    if outside:
        raise UserError(f"the trainable parameter '{outside[0]}' lies outside the sharded transformers model",
                        where="trainer.strategy", fix="use trainer.strategy: ddp for this model and strategy")
    blocks = block_classes(model)
    before = dict(model.named_parameters(remove_duplicate=False))
    if mesh.ndim == 2 and mesh.shape[0] == 1:  # one node: plain FSDP over the second dimension
        mesh = mesh[mesh.mesh_dim_names[1]]
    for module in root.modules():
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(root, mesh=mesh)
    after = dict(model.named_parameters(remove_duplicate=False))
    return {id(p): after[name] for name, p in before.items()}


def reshard(model: nn.Module) -> None:
    """Put every unit's parameters back in their sharded form. FSDP2 leaves the root unit
    unsharded after a forward without backward (an evaluation), its parameters then plain
    tensors under the same names; between Lightning calls clbench keeps them sharded, so
    optimizers, checkpoints and the frozen-base record always see the same parameter objects."""
    from torch.distributed.fsdp import FSDPModule

    for module in shard_root(model).modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def check_unchanged(model: nn.Module) -> None:
    """Refuse parameters created after sharding: FSDP would neither shard nor reduce them."""
    from torch.distributed.tensor import DTensor

    inside = {id(p) for p in shard_root(model).parameters()}
    added = [name for name, p in model.named_parameters() if not isinstance(p, DTensor)
             and (id(p) in inside or p.requires_grad)]
    if added:
        raise RuntimeError(f"parameter '{added[0]}' was added after the model was sharded: a strategy that "
                           "supports_sharded must create its parameters in adapt_model()")


def model_state(model: nn.Module) -> dict[str, Any]:
    """The model's state dict with whole tensors on the CPU. Sharded, this is a collective
    (every rank must call it) and only global rank 0 receives the tensors; others get ``{}``."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    reshard(model)
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


