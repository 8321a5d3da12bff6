"""Sequential LoRA (SeqLoRA): one shared LoRA adapter trained on every task in turn.

The adapter baseline of the continual instruction-tuning papers (MH-MoE's "SeqLoRA", MoSEs'
"LoRA-based Sequential Fine-Tuning"): low-rank adapters (Hu et al. 2021, "LoRA") are added to
a frozen pretrained model once, and the same adapter parameters are trained sequentially across
all tasks with nothing against forgetting. Other methods (EWC, GEM) run "on top of the SeqLoRA
setup" as their own strategy on a model whose only trainable parameters are an adapter's
(``hf_causal_lm``'s ``lora`` option); the helpers here are shared with :mod:`clbench.strategies.o_lora`.

The adapter is made by peft (``inject_adapter_in_model`` on ``ctx.model.hf``, or on the
model itself when it has no ``hf``): each targeted ``nn.Linear`` becomes a peft LoRA layer whose
``base_layer`` holds the original, frozen weight. The module's state dict then has the base
under ``...base_layer.weight`` and the adapter under ``...lora_A.<name>.weight`` /
``...lora_B.<name>.weight``; on resume :meth:`SeqLoRA.adapt_model` re-injects the adapter so
the checkpoint's keys and shapes exist before the weights load.

Defaults: r = 8 and α = 32, MoSEs' LoRA baseline and O-LoRA's released code (MH-MoE gives no
rank); dropout 0.1, O-LoRA's code. Target modules: the attention query and value projections
(peft's table per architecture: ``q_proj``/``v_proj`` on Llama and Qwen, ``c_attn`` on GPT-2),
the LoRA paper's best choice for a fixed budget (its Sec. 7.1) and what O-LoRA's TRACE port
adapts. Every other weight, embeddings and head included, is frozen.
"""

from __future__ import annotations

import warnings
from typing import Annotated, Any

import torch
from pydantic import Field
from torch import nn

from clbench import ArgumentError, Strategy

ADAPTER = "default"


def lora_target(model: nn.Module) -> nn.Module:
    """The module adapters go into: the transformers model of a ``CausalLM``, else the model."""
    return getattr(model, "hf", model)


def lora_config(r: int, alpha: float, dropout: float, target_modules: list[str] | None,
                layers: list[int] | None) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout,
                      target_modules=list(target_modules) if target_modules is not None else None,
                      layers_to_transform=list(layers) if layers is not None else None, bias="none")


def adapter_names(model: nn.Module) -> list[str]:
    """Names of the LoRA adapters present in ``model``."""
    from peft.tuners.lora import LoraLayer

    names: set[str] = set()
    for m in model.modules():
        if isinstance(m, LoraLayer):
            names.update(m.lora_A.keys())
    return sorted(names)


def lora_layers(model: nn.Module) -> list[nn.Module]:
    """Every peft LoRA layer of ``model``, in module order."""
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def add_adapter(model: nn.Module, config: Any, name: str) -> None:
    """Inject LoRA adapter ``name`` into ``model``; everything but LoRA weights is frozen."""
    from peft.functional import inject_adapter_in_model

    target = lora_target(model)
    try:
        with warnings.catch_warnings():  # a second adapter is what we mean, not a mistake
            warnings.filterwarnings("ignore", message=".*Already found a `peft_config`.*")
            inject_adapter_in_model(config, target, adapter_name=name)
    except ValueError as err:
        raise ArgumentError("strategy", "target_modules", f"cannot add LoRA adapters: {str(err).splitlines()[0]}",
                            fix="name the linear layers to adapt, e.g. [q_proj, v_proj]") from None
    for n, p in model.named_parameters():
        if "lora_" not in n:
            p.requires_grad_(False)


def refuse_other_adapters(model: nn.Module, strategy: str) -> None:
    """A strategy that makes its own adapters cannot share the model with a builder's adapter
    (``model.init_args.lora``): peft would run only one of them, silently."""
    found = adapter_names(model)
    if found:
        raise ArgumentError("model", "lora", f"the model already has LoRA adapters ({', '.join(found)}); {strategy} "
                            "adds its own", fix=f"remove lora from the model's init_args, or use another strategy "
                                                f"than {strategy}")


def activate(model: nn.Module, names: list[str], trainable: list[str]) -> None:
    """Make ``names`` the adapters that run (their outputs are summed); only ``trainable`` train."""
    from peft.functional import set_adapter, set_requires_grad

    target = lora_target(model)
    set_adapter(target, list(names))
    frozen = [n for n in names if n not in trainable]
    if frozen:
        set_requires_grad(target, frozen, requires_grad=False)


class SeqLoRA(Strategy):
    """One shared LoRA adapter on a frozen model, trained on each task in turn.

    Args:
        r: LoRA rank.
        alpha: LoRA α; the adapter's output is scaled by α / r.
        dropout: dropout on the adapter's input.
        target_modules: names (or name suffixes) of the linear layers to adapt; ``None`` takes
            the architecture's attention query and value projections from peft's table.
        layers: indices of the transformer layers to adapt; ``None`` adapts every layer.
    """

    supports_distributed = True  # the adapter is created from the same seeded RNG on every rank
    supports_sharded = True      # the adapter is injected before anything runs, so before sharding

    def __init__(self, r: Annotated[int, Field(ge=1)] = 8, alpha: Annotated[float, Field(gt=0)] = 32.0,
                 dropout: Annotated[float, Field(ge=0, lt=1)] = 0.1,
                 target_modules: Annotated[list[str], Field(min_length=1)] | None = None,
                 layers: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] | None = None):
        super().__init__()
        self.r = r
        self.alpha = alpha
        self.dropout = dropout
        self.target_modules = target_modules
        self.layers = layers

    def config(self) -> Any:
        return lora_config(self.r, self.alpha, self.dropout, self.target_modules, self.layers)

    def setup(self, ctx, experiences, seed):
        super().setup(ctx, experiences, seed)
        refuse_other_adapters(ctx.model, "seq_lora")

    def adapt_model(self, ctx, upto):
        """The one adapter, injected once (before the first evaluation)."""
        if ADAPTER not in adapter_names(ctx.model):
            add_adapter(ctx.model, self.config(), ADAPTER)
            activate(ctx.model, [ADAPTER], trainable=[ADAPTER])


def base_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict without LoRA weights, under the names it had before injection."""
    return {k.replace(".base_layer.", "."): v for k, v in model.state_dict().items() if "lora_" not in k}
