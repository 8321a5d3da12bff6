"""Finding the MLPs of a model and widening them without changing its function.

Used by the ``grow`` strategy (clbench/strategies/grow.py, "Grow, Don't Overwrite"). Three kinds of MLP
are recognised, by structure rather than by model class, so any model built from them works:

* gated MLPs of Hugging Face decoders (Qwen3, LLaMA, Gemma, Mistral): a module with
  ``gate_proj``, ``up_proj`` and ``down_proj`` computing ``down(act(gate(x)) * up(x))``;
* timm's ``Mlp`` (ViT blocks' ``mlp``): ``fc1`` -> activation -> ``fc2``, with no norm inside
  (a norm over the hidden units, timm's ``scale_mlp_norm``, is not elementwise, so such an MLP
  cannot be widened function-preservingly and is skipped);
* plain MLPs inside an ``nn.Sequential``: ``Linear``, one or more elementwise modules
  (activations, dropout), ``Linear`` (``clbench.models.factories.mlp``). Pairs are taken greedily from the
  input side and never overlap (``Linear, ReLU, Linear, ReLU, Linear`` gives one MLP, the first
  two linears), so every linear has exactly one role, up or down, and the G-Freeze / G-Train
  masks of the paper are well defined for it.

An MLP is named by its module (``blocks.0.mlp``, ``model.layers.1.mlp``) or, for a plain one, by
its Sequential and the two children's keys (``1:3`` for the root Sequential's children 1 and 3).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# Modules that act on every hidden unit separately and identically: duplicated pre-activations
# give duplicated activations, which is all the function-preservation argument needs.
ELEMENTWISE = (nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Mish, nn.Tanh, nn.Sigmoid, nn.LeakyReLU, nn.ELU,
               nn.SELU, nn.CELU, nn.Softplus, nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Dropout,
               nn.AlphaDropout, nn.Identity)


@dataclass(frozen=True)
class MLP:
    """One MLP: the qualified names of its input-side projections (up, and gate if gated) and
    of its down projection."""

    name: str
    ups: tuple[str, ...]
    down: str

    @property
    def linears(self) -> tuple[str, ...]:
        return (*self.ups, self.down)

    def width(self, model: nn.Module) -> int:
        """The hidden width p (the down projection's input size)."""
        return model.get_submodule(self.down).in_features


def _linear(module: object) -> bool:
    # Exactly nn.Linear: a subclass (quantised, adapter-wrapped) would lose its behaviour when
    # replaced by a plain, wider nn.Linear.
    return type(module) is nn.Linear


def _elementwise(module: object) -> bool:
    kind = type(module)
    if kind.__module__.startswith("timm.layers.activations"):  # timm's own GELU, Swish, ...
        return kind.__name__ != "PReLU"  # PReLU may learn one slope per unit
    return module is None or isinstance(module, ELEMENTWISE)


def _sequential_pairs(seq: nn.Sequential):
    children = list(seq._modules.items())
    i = 0
    while i < len(children):
        key, first = children[i]
        j = i + 1
        while j < len(children) and _elementwise(children[j][1]):
            j += 1
        if (_linear(first) and i + 1 < j < len(children) and _linear(children[j][1])
                and first.out_features == children[j][1].in_features):
            yield key, children[j][0]
            i = j + 1
        else:
            i += 1


def find_mlps(model: nn.Module) -> list[MLP]:
    """Every growable MLP of ``model``, in module order."""
    found: list[MLP] = []
    used: set[str] = set()
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        candidates: list[MLP] = []
        if all(_linear(getattr(module, a, None)) for a in ("gate_proj", "up_proj", "down_proj")):
            candidates.append(MLP(name, (prefix + "gate_proj", prefix + "up_proj"), prefix + "down_proj"))
        elif (_linear(getattr(module, "fc1", None)) and _linear(getattr(module, "fc2", None))
              and _elementwise(getattr(module, "norm", None)) and _elementwise(getattr(module, "act", None))):
            candidates.append(MLP(name, (prefix + "fc1",), prefix + "fc2"))
        elif isinstance(module, nn.Sequential):
            candidates += [MLP(f"{prefix}{a}:{b}", (prefix + a,), prefix + b) for a, b in _sequential_pairs(module)]
        for mlp in candidates:
            ups = [model.get_submodule(q) for q in mlp.ups]
            down = model.get_submodule(mlp.down)
            if any(u.out_features != down.in_features for u in ups) or used & set(mlp.linears):
                continue  # not the shape of an MLP (timm's GluMlp), or a linear already taken
            used |= set(mlp.linears)
            found.append(mlp)
    return found


def _replace(model: nn.Module, qualname: str, new: nn.Module) -> None:
    parent, _, attr = qualname.rpartition(".")
    setattr(model.get_submodule(parent), attr, new)


def _like(old: nn.Linear, in_features: int, out_features: int) -> nn.Linear:
    new = nn.Linear(in_features, out_features, bias=old.bias is not None, device=old.weight.device,
                    dtype=old.weight.dtype)
    new.train(old.training)
    return new


@torch.no_grad()
def grow_mlp(model: nn.Module, mlp: MLP, k: int) -> int:
    """Widen ``mlp`` from p to k·p hidden units in place; returns p.

    Up (and gate) weights are stacked k times along their outputs, ``Ŵ¹ = [W¹ … W¹]``; the down
    weight is stacked k times along its inputs, each copy scaled by 1/k, ``Ŵ² = [W²/k … W²/k]``.
    Hidden unit j + m·p is a copy of unit j, so ``Ŵ²·act(Ŵ¹x) = Σ_m (1/k)·W²·act(W¹x) = W²·act(W¹x)``.
    Biases (the paper leaves them out): the up/gate bias is copied with its rows (each copy
    must see the same pre-activation); the down bias is kept as is (it is added once, after
    the sum). The modules are replaced by new ``nn.Linear`` of the grown shape, same dtype and
    device, so the state dict's shapes change and its keys do not.
    """
    if k < 2:
        raise ValueError(f"the expansion factor k must be at least 2, got {k}")
    p = mlp.width(model)
    for name in mlp.ups:
        old = model.get_submodule(name)
        new = _like(old, old.in_features, old.out_features * k)
        new.weight.copy_(old.weight.repeat(k, 1))
        if old.bias is not None:
            new.bias.copy_(old.bias.repeat(k))
        _replace(model, name, new)
    old = model.get_submodule(mlp.down)
    new = _like(old, old.in_features * k, old.out_features)
    new.weight.copy_((old.weight / k).repeat(1, k))
    if old.bias is not None:
        new.bias.copy_(old.bias)
    _replace(model, mlp.down, new)
    owner = model.get_submodule(mlp.name) if ":" not in mlp.name.rpartition(".")[2] else None
    if owner is not None and isinstance(getattr(owner, "intermediate_size", None), int):
        owner.intermediate_size = p * k  # transformers' MLPs keep their width as an attribute
    return p
