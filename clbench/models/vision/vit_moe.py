"""``vit_moe``: the thesis's ViT-MoE on timm's ``VisionTransformer``.

The dense ViT is built by timm (any size: explicit ``embed_dim``/``depth``/... for the
stream's image size, or a timm model ``name`` such as ``vit_small_patch16_224``); the MLP of
every block in ``moe_blocks`` is then replaced by :class:`clbench.models.vision.moe.MoEMLP`. The
rest (patch embedding, attention, norms, class token, head) is timm's, so a ViT-MoE and the
dense ViT it came from have "identical structure except for the router and additional FFN
experts".

Thesis labels (``label=``; explicit arguments override the label's settings):

=========================  ===============================================================
``ViT``                    the dense ViT (no MoE blocks)
``MoE``                    4 experts, top-1 switch router, balance loss only
``MoE-many``               8 experts, top-2 switch router
``MoE_ensemble_LR_scale``  4 always-on experts with learning-rate multipliers
                           (1.0, 0.5, 0.1, 0.01), no router
``EMA router``             4 experts, top-1, ``ema_centroid`` router (variant 1)
``Prototype router``       4 paths, one routing decision, ``prototype`` router (variant 2)
=========================  ===============================================================

``router="prototype"`` builds :class:`clbench.models.vision.prototype.PrototypeViT` instead of MoE
MLPs: the blocks in ``moe_blocks`` (a suffix) and the head are duplicated per expert path
behind one routing decision, and the early blocks are frozen (see that module).

Choices:

* ``moe_blocks`` (0-based block indices) defaults to the last third of the blocks, and at least
  the last block: ``range(depth - max(1, depth // 3), depth)``, i.e. blocks 8-11 of 12, 4-5 of
  6, the last one of 2. An MoE model with no MoE block is refused (``label: ViT`` is the dense
  model). The thesis reports routing
  "at the first MoE layer (block 8 in depth)" and its variant 2 splits "the final 4 layers";
  0-based block 8 of 12 starts exactly the final four.
* Initialisation: random by default (timm's initialisation for the dense parts; experts
  drawn independently with timm's truncated normal, std 0.02). ``weights_path`` loads a local
  dense ViT state dict (``.pth``/``.bin``/``.safetensors``, passed through timm's
  ``checkpoint_filter_fn``, which resamples position embeddings) and copies each MoE block's
  dense MLP into every expert (the thesis's model transfer); the head is re-initialised when
  the class count differs. ``expert_init="copy"`` copies the randomly initialised dense MLP
  into every expert instead (an MoE that starts as its dense twin).
* ``expert_mlp_ratio``: the experts' MLP ratio; the dense ``mlp_ratio`` (equal active
  parameters, the thesis's small models) by default, ``mlp_ratio / num_experts`` for equal
  total parameters (its mini models, "MoE MLPs = 1/4"). Model transfer needs the dense ratio.
* ``level``, ``top_k``, shared experts, learning-rate multipliers, ``dispatch`` (the experts
  looped over, the default, or ``grouped`` in one product per matrix) and the routers' options:
  see :mod:`clbench.models.vision.moe` and :mod:`clbench.models.vision.routers`.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Literal

from pydantic import Field
from torch import nn
from typing_extensions import TypedDict

from clbench.errors import did_you_mean
from clbench.config.validation import ArgumentError, mapping_argument
from clbench.models.vision.moe import MoEMLP

LABELS: dict[str, dict] = {
    "ViT": {"moe_blocks": []},
    "MoE": {"num_experts": 4, "top_k": 1, "router": "switch"},
    "MoE-many": {"num_experts": 8, "top_k": 2, "router": "switch"},
    "MoE_ensemble_LR_scale": {"num_experts": 0, "num_shared": 4, "shared_lr_mult": [1.0, 0.5, 0.1, 0.01]},
    "EMA router": {"num_experts": 4, "top_k": 1, "router": "ema_centroid"},
    "Prototype router": {"num_experts": 4, "top_k": 1, "router": "prototype"},
}
# Written out so that 'clbench show vit_moe' lists them from the source; tests keep them equal to
# LABELS and to the routers.
Label = Literal["ViT", "MoE", "MoE-many", "MoE_ensemble_LR_scale", "EMA router", "Prototype router"]
RouterName = Literal["switch", "ema_centroid", "prototype"]
Positive = Annotated[int, Field(ge=1)]
Multiplier = Annotated[float, Field(gt=0)]  # a learning-rate multiplier
Unit = Annotated[float, Field(ge=0, le=1)]
Weight = Annotated[float, Field(ge=0)]  # a loss weight


@mapping_argument
class RouterArgs(TypedDict, total=False):
    """``router_args``: the options of every router (docs/moe-vit.md), with their ranges; each
    router takes only its own (its class's parameters: a test keeps the keys equal)."""

    # switch and ema_centroid
    gate: Literal["straight_through", "normalized", "raw"]
    balance_weight: Weight
    anneal_steps: Annotated[int, Field(ge=0)]
    balance_on: Literal["probs", "assignments"]
    # switch
    lr_mult: Multiplier
    # ema_centroid
    alpha_fast: Unit
    alpha_slow: Unit
    beta: Unit
    blend: Literal["scores", "centroid"]
    temperature: Annotated[float, Field(gt=0)]  # also the prototype router's
    margin: float
    repel_k: Annotated[int, Field(ge=0)]
    lambda_align: Weight
    lambda_cons: Weight
    lambda_fast: Weight
    lambda_slow: Weight
    detach_latent: bool
    # prototype
    alpha: Unit
    std_weight: Unit
    metric: Literal["cosine", "w2"]
    freeze_trunk: bool
DEFAULTS = {"num_experts": 4, "top_k": 1, "router": "switch", "num_shared": 0, "shared_lr_mult": None,
            "moe_blocks": None}


def vit_moe(num_classes: int, input_shape: tuple[int, ...], name: str | None = None, patch_size: Positive = 4,
            embed_dim: Positive = 64, depth: Positive = 4, num_heads: Positive = 4,
            mlp_ratio: Annotated[float, Field(gt=0)] = 4.0, label: Label | None = None,
            moe_blocks: list[Annotated[int, Field(ge=0)]] | None = None,
            num_experts: Annotated[int, Field(ge=0)] | None = None, top_k: Positive | None = None,
            num_shared: Annotated[int, Field(ge=0)] | None = None, router: RouterName | None = None,
            router_args: RouterArgs | None = None, level: Literal["image", "token"] = "image",
            pool: Literal["mean", "cls"] = "mean", expert_mlp_ratio: Annotated[float, Field(gt=0)] | None = None,
            expert_lr_mult: Multiplier | list[Multiplier] | None = None,
            shared_lr_mult: Multiplier | list[Multiplier] | None = None,
            shared_combine: Literal["mean", "sum"] = "mean", weights_path: str = "",
            expert_init: Literal["random", "copy"] = "random",
            drop_path_rate: Annotated[float, Field(ge=0, lt=1)] = 0.0,
            dispatch: Literal["loop", "grouped"] = "loop") -> nn.Module:
    """A timm ViT whose MLPs in ``moe_blocks`` are mixtures of experts (see the module notes).

    Each argument's type and range is declared above and checked before the run builds anything
    (:mod:`clbench.config.validation`); what depends on several arguments is checked here, as a
    one-line :class:`~clbench.config.validation.ArgumentError` naming the argument.
    """
    import timm
    from timm.models.vision_transformer import VisionTransformer

    given = {"num_experts": num_experts, "top_k": top_k, "router": router, "num_shared": num_shared,
             "shared_lr_mult": shared_lr_mult, "moe_blocks": moe_blocks}
    preset = LABELS.get(label, {})
    opts = {k: v if v is not None else preset.get(k, DEFAULTS[k]) for k, v in given.items()}
    experts, shared = opts["num_experts"], opts["num_shared"]
    dense = label == "ViT" or opts["moe_blocks"] == []
    if experts + shared == 0 and not dense:
        raise ArgumentError("model", "num_experts", "an MoE layer needs at least one expert, routed (num_experts) or "
                            "shared (num_shared)", fix="set num_experts >= 1, or use label: ViT for the dense model")
    if experts and opts["top_k"] > experts and not dense:
        raise ArgumentError("model", "top_k", f"top_k = {opts['top_k']} is more than num_experts = {experts}",
                            fix=f"choose top_k between 1 and {experts}")
    takes = router_options(opts["router"])
    other = [key for key in router_args or {} if key not in takes]
    if other:
        raise ArgumentError("model", f"router_args.{other[0]}", f"router '{opts['router']}' has no option "
                            f"'{other[0]}'", fix=did_you_mean(other[0], takes))

    in_ch, h, w = input_shape
    if name is None:
        model = VisionTransformer(img_size=(h, w), patch_size=patch_size, in_chans=in_ch, num_classes=num_classes,
                                  embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio,
                                  drop_path_rate=drop_path_rate)
    else:
        model = timm.create_model(name, pretrained=False, num_classes=num_classes, in_chans=in_ch,
                                  img_size=(h, w), drop_path_rate=drop_path_rate)
    if weights_path:
        from pickle import UnpicklingError

        from safetensors import SafetensorError

        try:
            load_dense_weights(model, weights_path)
        except (OSError, ValueError, RuntimeError, EOFError, UnpicklingError, SafetensorError) as err:
            detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ArgumentError("model", "weights_path", f"cannot load {weights_path}: {detail}",
                                fix="give a dense ViT state dict (.pth, .bin or .safetensors) of this architecture, "
                                    "written completely") from None

    blocks = model.blocks
    chosen = default_moe_blocks(len(blocks)) if opts["moe_blocks"] is None else list(opts["moe_blocks"])
    outside = [index for index in chosen if not 0 <= index < len(blocks)]
    if outside:
        raise ArgumentError("model", "moe_blocks", f"block(s) {outside} do not exist: this ViT has {len(blocks)} "
                            "blocks",
                            fix=f"list 0-based block indices in 0..{len(blocks) - 1}")
    if not chosen and label != "ViT":
        raise ArgumentError("model", "moe_blocks", "no block is an MoE block, so this is the dense ViT",
                            fix="list the blocks whose MLP becomes MoE, or use label: ViT for the dense model")
    try:
        return _mixture(model, chosen, opts, router_args=router_args, level=level, pool=pool,
                        expert_mlp_ratio=expert_mlp_ratio, expert_lr_mult=expert_lr_mult,
                        shared_combine=shared_combine, copy=bool(weights_path) or expert_init == "copy",
                        dispatch=dispatch)
    except ValueError as err:  # the layers' and routers' own checks (router_args, multipliers): all settings
        raise ArgumentError("model", "", str(err),
                            fix="see docs/moe-vit.md for the arguments and their ranges") from None


def router_options(router: str) -> set[str]:
    """The ``router_args`` keys ``router`` takes: its class's parameters and its bases'."""
    from clbench.models.vision import prototype
    from clbench.models.vision.routers import ROUTERS

    classes = [prototype.PrototypeRouter, prototype.PrototypeViT] if router == "prototype" else \
        ROUTERS[router].__mro__
    given = {"self", "dim", "num_experts", "top_k", "prefix", "vit", "split"}  # set by the harness
    return {name for cls in classes if cls is not nn.Module and "__init__" in vars(cls)
            for name, p in inspect.signature(cls.__init__).parameters.items()
            if name not in given and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def default_moe_blocks(depth: int) -> list[int]:
    """The last third of the blocks, and at least the last one: 8-11 of 12, 4-5 of 6, 1 of 2."""
    return list(range(depth - max(1, depth // 3), depth))


def _mixture(model: nn.Module, chosen: list[int], opts: dict, *, router_args, level, pool, expert_mlp_ratio,
             expert_lr_mult, shared_combine, copy: bool, dispatch: str) -> nn.Module:
    """Replace the MLPs of the ``chosen`` blocks by MoE layers (or, for the prototype router, wrap the ViT)."""
    blocks = model.blocks
    if opts["router"] == "prototype":  # paths are always copies of the dense final part
        from clbench.models.vision import prototype

        unsupported = {"expert_mlp_ratio": expert_mlp_ratio, "expert_lr_mult": expert_lr_mult,
                       "shared_lr_mult": opts["shared_lr_mult"], "dispatch": None if dispatch == "loop" else dispatch}
        return prototype.build(model, chosen, opts["num_experts"], opts["top_k"], opts["num_shared"], level,
                               router_args, unsupported)
    for index in chosen:
        dense = blocks[index].mlp
        hidden = None
        if expert_mlp_ratio is not None:
            hidden = max(1, int(dense.fc1.in_features * expert_mlp_ratio))
        blocks[index].mlp = MoEMLP.from_dense(
            dense, copy_weights=copy, hidden=hidden, num_experts=opts["num_experts"], top_k=opts["top_k"],
            num_shared=opts["num_shared"], level=level, pool=pool, router=opts["router"],
            router_args=router_args, shared_combine=shared_combine, expert_lr_mult=expert_lr_mult,
            shared_lr_mult=opts["shared_lr_mult"], dispatch=dispatch)
    model.moe_blocks = chosen
    return model


def load_dense_weights(model: nn.Module, path: str) -> None:
    """Load a local dense ViT state dict into ``model``; a head of another class count is kept fresh."""
    import inspect

    import torch
    from timm.models import load_state_dict
    from timm.models.vision_transformer import checkpoint_filter_fn

    # A weights file may come from anyone: read tensors only (torch.load(weights_only=True)), as the
    # runner reads checkpoints; a timm without the argument gets the file checked that way first.
    if "weights_only" in inspect.signature(load_state_dict).parameters:
        raw = load_state_dict(path, weights_only=True)
    else:  # pragma: no cover - timm before weights_only
        if not str(path).endswith(".safetensors"):
            torch.load(path, map_location="cpu", weights_only=True)
        raw = load_state_dict(path)
    state = checkpoint_filter_fn(raw, model)
    own = model.state_dict()
    for key in [k for k in state if k.startswith("head.")]:
        if key in own and state[key].shape != own[key].shape:
            del state[key]
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("head.")]
    if missing or unexpected:
        raise ValueError(f"{path}: weights do not fit this ViT (missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}); give the dense model's architecture arguments")
