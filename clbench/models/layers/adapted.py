"""What every adapter layer shares: the frozen linear it wraps, which linears a config targets,
how they are replaced, and the scale α/r each adapter runs at.

LoRA experts (:mod:`clbench.models.layers.moe_lora`) and MoSEs' sub-experts
(:mod:`clbench.models.layers.moses`) both wrap a frozen ``nn.Linear`` by module replacement;
peft's LoRA layers are read by :func:`adapter_scales` too.
"""

from __future__ import annotations

import re

from torch import Tensor, nn


class AdaptedLinear(nn.Module):
    """A frozen ``nn.Linear`` (``base_layer``) that an adapter wraps by module replacement; it
    still answers ``in_features``, ``out_features`` and ``weight`` like the layer it replaced."""

    def __init__(self, base: nn.Linear):
        super().__init__()
        self.base_layer = base
        for p in base.parameters():
            p.requires_grad_(False)

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    @property
    def out_features(self) -> int:
        return self.base_layer.out_features

    @property
    def weight(self) -> Tensor:  # code that reads ``linear.weight`` (tied checks, dtype probes)
        return self.base_layer.weight


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def matching_linears(model: nn.Module, target_modules: list[str], layers: list[int] | None = None
                     ) -> list[tuple[str, nn.Linear]]:
    """``(name, module)`` of every ``nn.Linear`` whose last name part is in ``target_modules`` and,
    when ``layers`` is given, that lies in a transformer layer ``layers.<i>.`` with i in it."""
    found = []
    for name, module in model.named_modules():
        if type(module) is not nn.Linear or name.rsplit(".", 1)[-1] not in target_modules:
            continue
        if layers is not None:
            match = _LAYER.search(name)
            if match is None or int(match.group(1)) not in layers:
                continue
        found.append((name, module))
    return found


def replace_linears(model: nn.Module, target_modules: list[str], layers: list[int] | None,
                    wrap) -> list[str]:
    """Replace each matching ``nn.Linear`` by ``wrap(linear)``; returns the replaced names."""
    names = []
    for name, linear in matching_linears(model, target_modules, layers):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, wrap(linear))
        names.append(name)
    return names


def adapter_scales(model) -> list[float]:
    """The distinct scales α/r of the model's adapter layers (peft's LoRA, O-LoRA's task LoRAs,
    LoRA experts, MoSEs' sub-experts: every module with ``lora_A`` and a ``scaling``), as they
    ran: what suites keep equal across the methods they compare."""
    found: set[float] = set()
    for module in model.modules():
        scaling = getattr(module, "scaling", None) if hasattr(module, "lora_A") else None
        values = scaling.values() if isinstance(scaling, dict) else [scaling]
        found.update(float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool))
    return sorted(found)
