"""The MoE MLP layer of the thesis's ViT-MoE block: N experts of the dense MLP's shape.

``MoEMLP`` replaces a transformer block's MLP (it receives the block's normed tokens
``(B, T, D)`` and returns the same shape). A router (``switch`` or ``ema_centroid``, see
:mod:`clbench.models.vision.routers`) picks ``top_k`` of ``num_experts`` routed experts per routing
unit; ``num_shared`` always-on experts run on every token.

Choices, each an option:

* ``level="image"`` (default: the thesis routes its proposed variants and its ``imagelevel``
  configs per image "to farther encourage domain experts") routes every image by the mean of
  its tokens (``pool="mean"``; ``"cls"`` uses the class token) and sends all its tokens to the
  chosen experts; ``level="token"`` routes each token.
* Combining: the chosen experts' outputs are weighted by the router's top-k gates (which sum
  to 1, "added and normalized"); shared experts are added and, with ``shared_combine="mean"``
  (default), the total is divided by ``1 + num_shared`` so that identical experts reproduce
  the dense MLP (model transfer); ``"sum"`` adds them unscaled.
* ``hidden`` is the expert's hidden width: the dense MLP's for equal active parameters, or a
  reduced one (``mlp_ratio / num_experts`` in the factory) for equal total parameters.
* Per-expert learning rates (the thesis's ensemble with multipliers 1.0, 0.5, 0.1, 0.01):
  the harness builds one optimizer over all trainable parameters, so a multiplier ``r`` is
  realised by the parametrisation ``W = r * theta``: the stored expert weights are the
  effective ones divided by ``r``. Under Adam/AdamW the effective learning rate of that
  expert is ``r`` times the optimizer's (their update ignores the gradient's scale); under
  plain SGD it is ``r**2``; AdamW's decoupled weight decay is unchanged. ``expert_lr_mult``
  lists the routed experts' multipliers, ``shared_lr_mult`` the shared ones'.

Dispatch: the (unit, expert) pairs are sorted by expert (``argsort``), the units gathered
with one ``index_select``, the experts run on their contiguous slices, and the gated outputs
are scattered back with one ``index_add_``. How the experts run is ``dispatch``:

* ``"loop"`` (default): each expert's two matrix products on its slice, a loop over experts
  (none over samples). The slices' sizes are read on the host, which waits for the GPU once a
  layer, and each expert launches its own small products. Works under ``torch.compile`` (the
  data-dependent slices break the graph there; tested with the ``aot_eager`` backend).
* ``"grouped"``: every expert at once, one ``torch.nn.functional.grouped_mm`` per matrix, the
  slices' bounds kept on the device: no host sync, two launches a layer whatever the number of
  experts, and a graph ``torch.compile`` captures whole. torch's grouped product takes
  bfloat16 or float16 (:data:`GROUPED_DTYPES`), the dtypes a GPU trains a ViT in
  (``bf16-mixed``); a layer computing in float32 runs the loop. Under autocast the inputs are
  cast to its dtype first, as it casts a linear layer's; the bias is added after the product
  rather than inside it, so the result rounds differently from ``"loop"`` (tested to float
  rounding). It is the candidate for the GPU step-time target (``perf/gpu_report.py`` times
  both); the committed entries were made with ``"loop"``.

Both work under bf16 autocast (outputs are accumulated in the input's dtype).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from clbench.models import routing_channel as routing
from clbench.models.vision.routers import make_router


#: The dtypes torch's grouped product takes (its GPU kernels, and ``torch.compile`` anywhere).
GROUPED_DTYPES = (torch.bfloat16, torch.float16)


def computing_dtype(x: Tensor) -> torch.dtype:
    """The dtype a linear layer computes ``x`` in: autocast's where it is on, else ``x``'s."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def _mults(value: float | Sequence[float] | None, count: int, name: str) -> list[float]:
    if value is None:
        return [1.0] * count
    values = [float(value)] * count if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(values) != count:
        raise ValueError(f"{name} needs {count} values, got {len(values)}")
    if any(v <= 0 for v in values):
        raise ValueError(f"{name} must be > 0, got {values}")
    return values


class ExpertBank(nn.Module):
    """``count`` two-layer MLPs ``dim -> hidden -> dim`` stored as stacked tensors."""

    def __init__(self, count: int, dim: int, hidden: int, act: nn.Module,
                 lr_mult: float | Sequence[float] | None = None):
        super().__init__()
        self.count, self.dim, self.hidden = count, dim, hidden
        self.w1 = nn.Parameter(torch.empty(count, hidden, dim))
        self.b1 = nn.Parameter(torch.zeros(count, hidden))
        self.w2 = nn.Parameter(torch.empty(count, dim, hidden))
        self.b2 = nn.Parameter(torch.zeros(count, dim))
        self.act = act
        mults = _mults(lr_mult, count, "lr_mult")
        self.scaled = any(m != 1.0 for m in mults)
        self.register_buffer("lr_mult", torch.tensor(mults), persistent=False)
        nn.init.trunc_normal_(self.w1, std=0.02)  # timm's ViT initialisation of Linear layers
        nn.init.trunc_normal_(self.w2, std=0.02)
        self._rescale()

    def _rescale(self) -> None:
        """Store every parameter divided by its expert's multiplier (W = r * theta)."""
        if self.scaled:
            with torch.no_grad():
                for p in (self.w1, self.b1, self.w2, self.b2):
                    p.div_(self.lr_mult.view(-1, *[1] * (p.dim() - 1)))

    def load_dense(self, fc1: nn.Linear, fc2: nn.Linear) -> None:
        """Copy a dense MLP's weights into every expert (model transfer)."""
        if fc1.weight.shape != self.w1.shape[1:] or fc2.weight.shape != self.w2.shape[1:]:
            raise ValueError(f"dense MLP {tuple(fc1.weight.shape)} does not match experts "
                             f"{tuple(self.w1.shape[1:])}: model transfer needs the dense hidden width")
        with torch.no_grad():
            self.w1.copy_(fc1.weight.expand_as(self.w1))
            self.w2.copy_(fc2.weight.expand_as(self.w2))
            self.b1.copy_(fc1.bias.expand_as(self.b1) if fc1.bias is not None else 0)
            self.b2.copy_(fc2.bias.expand_as(self.b2) if fc2.bias is not None else 0)
        self._rescale()

    def effective(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        if not self.scaled:
            return self.w1, self.b1, self.w2, self.b2
        r = self.lr_mult
        return (self.w1 * r[:, None, None], self.b1 * r[:, None],
                self.w2 * r[:, None, None], self.b2 * r[:, None])

    def run(self, e: int, x: Tensor, weights: tuple[Tensor, ...], drop: nn.Module) -> Tensor:
        w1, b1, w2, b2 = weights
        return drop(F.linear(drop(self.act(F.linear(x, w1[e], b1[e]))), w2[e], b2[e]))

    def run_grouped(self, x: Tensor, experts: Tensor, weights: tuple[Tensor, ...], drop: nn.Module) -> Tensor:
        """Every expert on its units of ``x`` ``(U, T, D)``, whose units are sorted by their
        expert ``experts`` ``(U,)``: one grouped product per matrix, the groups' bounds computed
        on the device."""
        w1, b1, w2, b2 = weights
        units, tokens, dim = x.shape
        counts = torch.zeros(self.count, dtype=torch.long, device=x.device).index_add_(0, experts,
                                                                                        torch.ones_like(experts))
        ends = (counts.cumsum(0) * tokens).to(torch.int32)
        rows = experts.repeat_interleave(tokens)  # each row's expert, for its bias
        dtype = computing_dtype(x)
        hidden = F.grouped_mm(x.reshape(-1, dim).to(dtype), w1.to(dtype).transpose(-2, -1), offs=ends)
        # index_select, whose gradient has a deterministic CUDA kernel (strict mode, clbench's default)
        hidden = drop(self.act(hidden + b1.to(dtype).index_select(0, rows)))
        out = F.grouped_mm(hidden, w2.to(dtype).transpose(-2, -1), offs=ends) + b2.to(dtype).index_select(0, rows)
        return drop(out).reshape(units, tokens, -1)


class MoEMLP(nn.Module):
    """Drop-in replacement of a ViT block's MLP: routed experts, optional shared experts."""

    records_routing = True

    def __init__(self, dim: int, hidden: int, num_experts: int = 4, top_k: int = 1,
                 num_shared: int = 0, level: str = "image", pool: str = "mean", router: str = "switch",
                 router_args: dict | None = None, act: nn.Module | None = None, drop: float = 0.0,
                 shared_combine: str = "mean", expert_lr_mult: float | Sequence[float] | None = None,
                 shared_lr_mult: float | Sequence[float] | None = None, dispatch: str = "loop"):
        super().__init__()
        if num_experts < 0 or num_shared < 0 or num_experts + num_shared == 0:
            raise ValueError("an MoE layer needs at least one expert")
        if level not in ("image", "token"):
            raise ValueError(f"level must be 'image' or 'token', got {level!r}")
        if pool not in ("mean", "cls"):
            raise ValueError(f"pool must be 'mean' or 'cls', got {pool!r}")
        if shared_combine not in ("mean", "sum"):
            raise ValueError(f"shared_combine must be 'mean' or 'sum', got {shared_combine!r}")
        if dispatch not in ("loop", "grouped"):
            raise ValueError(f"dispatch must be 'loop' or 'grouped', got {dispatch!r}")
        act = act if act is not None else nn.GELU()
        self.dim, self.hidden, self.num_experts, self.top_k = dim, hidden, num_experts, top_k
        self.num_shared, self.level, self.pool, self.shared_combine = num_shared, level, pool, shared_combine
        self.dispatch = dispatch
        # a layer with shared experts only (the thesis's ensemble) routes nothing
        self.records_routing = num_experts > 0
        self.experts = ExpertBank(num_experts, dim, hidden, act, expert_lr_mult) if num_experts else None
        self.shared = ExpertBank(num_shared, dim, hidden, act, shared_lr_mult) if num_shared else None
        self.router = make_router(router, dim, num_experts, top_k, **(router_args or {})) if num_experts else None
        self.drop = nn.Dropout(drop)

    @classmethod
    def from_dense(cls, mlp: nn.Module, copy_weights: bool, **kwargs) -> "MoEMLP":
        """Build from a timm ``Mlp`` (fc1, act, fc2): its shape, activation and dropout; with
        ``copy_weights`` its weights go into every routed and shared expert."""
        hidden = kwargs.pop("hidden", None) or mlp.fc1.out_features
        drop = getattr(getattr(mlp, "drop1", None), "p", 0.0)
        layer = cls(mlp.fc1.in_features, hidden, act=mlp.act, drop=drop, **kwargs)
        if copy_weights:
            for bank in (layer.experts, layer.shared):
                if bank is not None:
                    bank.load_dense(mlp.fc1, mlp.fc2)
        return layer.to(mlp.fc1.weight.device)

    def _feats(self, x: Tensor) -> Tensor:
        if self.level == "token":
            return x.reshape(-1, x.shape[-1])
        return x[:, 0] if self.pool == "cls" else x.mean(1)

    def forward(self, x: Tensor) -> Tensor:
        batch, tokens, dim = x.shape
        out = x.new_zeros(x.shape)
        if self.experts is not None:
            experts, gates, probs = self.router(self._feats(x))
            routing.record(self, experts=experts, gates=probs)
            units = x.reshape(-1, 1, dim) if self.level == "token" else x  # (U, T, D)
            flat = experts.reshape(-1)
            order = torch.argsort(flat, stable=True)
            unit_of = order // self.top_k
            gathered = units.index_select(0, unit_of)
            weights = self.experts.effective()
            if self.dispatch == "grouped" and computing_dtype(x) in GROUPED_DTYPES:
                y = self.experts.run_grouped(gathered, flat[order], weights, self.drop)
            else:
                sizes = torch.bincount(flat, minlength=self.num_experts).tolist()
                ys = [self.experts.run(e, chunk, weights, self.drop)
                      for e, chunk in enumerate(gathered.split(sizes)) if sizes[e]]
                y = torch.cat(ys) if len(ys) > 1 else ys[0]
            g = gates.reshape(-1)[order].to(y.dtype)[:, None, None]
            routed = out.reshape(units.shape)
            routed.index_add_(0, unit_of, (y * g).to(out.dtype))
        if self.shared is not None:
            weights = self.shared.effective()
            for s in range(self.num_shared):
                out = out + self.shared.run(s, x, weights, self.drop).to(out.dtype)
            if self.shared_combine == "mean":
                out = out / (self.num_shared + (1 if self.experts is not None else 0))
        return out

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, hidden={self.hidden}, num_experts={self.num_experts}, top_k={self.top_k}, "
                f"num_shared={self.num_shared}, level={self.level}")

