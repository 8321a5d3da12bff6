"""Mixture-of-LoRA-experts layers for frozen linear modules (LoRAMoE and MH-MoE).

:class:`MoELoRALinear` replaces a frozen ``nn.Linear`` (kept as ``base_layer``) by

    y = base(x) + Σ_m Σ_{j ∈ S_m} g_{m,j} · B_{m,j} A_{m,j} x_m · (α / r)

with the input split into H contiguous slices ``x = [x_1 ‖ … ‖ x_H]`` (MH-MoE, Eq. 12), a
bias-free linear router per slice (Eq. 13), K LoRA experts per slice mapping d_in/H → d_out
(Eq. 14) and the head outputs summed (Eqs. 15–16). ``kind="loramoe"`` is the case H = 1: one
router over the whole input and K experts d_in → d_out (Dou et al. 2024, "LoRAMoE").

Gating:

* ``top_k=None`` (LoRAMoE only): dense softmax over all K experts, as in LoRAMoE's released
  code (``softmax(lora_route(x))``, every expert runs).
* ``top_k=k``: the k largest router logits per slice; their weights are the softmax renormalised
  over the selected set (MH-MoE Eq. 13, and MH-MoE's LoRAMoE baseline, K = 4, top-1).
* Top-1 and the router's gradient. With k = 1 the renormalised weight is ≡ 1, so the task loss
  gives the router no gradient and it would never learn (the paper does not say how its routers
  train). ``top1_gate="probability"`` (the default) uses instead the un-renormalised softmax
  probability p_j of the selected expert over all K, as the Switch Transformer does
  (Fedus et al. 2022, y = p_j E_j(x)); ``top1_gate="renormalized"`` keeps the literal ≡ 1 weight
  (a router frozen at its initialisation). For k > 1 the renormalised weights carry gradient and
  Eq. 13 is used as written.

Dispatch is batched: every slice's K experts are stacked in ``lora_A`` (H, K, r, d_in/H) and
``lora_B`` (H, K, r, d_out; expert (m, j) adds ``(A_{m,j} x_m)ᵀ B_{m,j}``). One GEMM against a
block-diagonal matrix of the H routers and all A's gives every head's logits and rank-r codes;
the gates (zero off the selected set: the top-k weights scattered into a one-hot combination)
scale the codes, and one GEMM over the H·K·r codes applies the B's. No Python loop runs over
tokens or experts. Cost: all K experts' codes are computed, and the block-diagonal form spends
H× the multiply-adds of H separate slice products on the A part. At matched active parameters
H·r(mh_moe) ≈ r(loramoe), so this is LoRAMoE's own GEMM size, and two large GEMMs beat H small
batched ones (or a per-token gather of expert weights) at the small ranks used with frozen bases.

Choices where the papers are silent: A initialised like peft's LoRA (Kaiming uniform, a = √5),
B = 0 (each expert starts as the identity residual 0); the router initialised like
``nn.Linear`` (LoRAMoE's ``lora_route``); the router reads the undropped input; ``dropout`` on
the experts' input (0 by default: neither MH-MoE nor its baselines give a value).

LoRAMoE's localized balancing constraint (``balance_weight`` > 0, off by default, as MH-MoE
mentions no auxiliary loss for either method) is computed as LoRAMoE's released layer computes
it (:func:`localized_balance`): the importance matrix Q holds each sample's importance of each
expert (its gate weights summed over the sample's tokens), Z = I ∘ Q weights Q by 1 + δ where the
expert's type matches the sample's and by 1 − δ elsewhere (the first half of the experts is of
type 1, "world knowledge", the second half of type 0), and the term is
``balance_weight · cv²(Z)`` over all of Z's entries (sample variance over the squared mean). Each
adapted module adds its own term through :func:`clbench.models.auxiliary.add` (name
``"balance"``), summed over modules and layers as LoRAMoE adds them to the loss. δ = 0
(``balance_delta``, LoRAMoE's ``blc_alpha``) needs no types; δ > 0 reads the samples' type from
``sample_type`` (set by the strategy per experience). Padding tokens, which the objective names
through :func:`clbench.models.routing_channel.units`, are left out of the sums (LoRAMoE's script trains
one sample per batch, so it has none). With H heads every head's experts are split in halves.

Routing records: every layer sets ``records_routing`` and reports its top-k choices. A unit is a
token; the layer does not see the attention mask, so the objective names the padding through
:func:`clbench.models.routing_channel.units` and it is left out. For MH-MoE the experts are
numbered ``m·K + j`` (``num_experts = H·K``) and a unit's ``experts`` row is the tuple
(S_1, …, S_H), the route of MH-MoE's N_eff; gates are each router's softmax over its K
experts, divided by H so that a unit's gates sum to 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from clbench.models import auxiliary
from clbench.models.gating import dense_gates, top_k_gates
from clbench.models.layers.adapted import AdaptedLinear, replace_linears
from clbench.models import routing_channel as routing

KINDS = ("loramoe", "mh_moe")
TOP1_GATES = ("probability", "renormalized")


def cv_squared(x: Tensor) -> Tensor:
    """Squared coefficient of variation (LoRAMoE's and the sparsely-gated MoE's balance term)."""
    if x.numel() <= 1:
        return x.new_zeros(())
    return x.float().var() / (x.float().mean() ** 2 + 1e-10)


def type_weights(types: Tensor, num_experts: int, delta: float) -> Tensor:
    """LoRAMoE's I matrix (B, K) for sample types (B,) in {0, 1}: 1 + δ on the experts of the
    sample's type (type 1 the first K/2 experts, type 0 the last K/2), 1 − δ on the others."""
    if num_experts % 2:
        raise ValueError(f"the type-wise term splits the experts in halves; {num_experts} is odd")
    first = (types.reshape(-1, 1) == 1).expand(-1, num_experts // 2)
    match = torch.cat([first, ~first], dim=1)
    return torch.where(match, 1.0 + delta, 1.0 - delta)


def localized_balance(importance: Tensor, types: Tensor | int | None = None, delta: float = 0.0) -> Tensor:
    """LoRAMoE's localized balancing constraint cv²(I ∘ Q) for the importance matrix Q
    ``(B, K)`` or ``(B, H, K)`` (each sample's summed gate weights; per head for H routers).

    δ = 0 is the plain cv² over every (sample, expert) entry, so two samples that each send
    everything to a different expert are imbalanced (cv² = 4/3 for K = 2), not balanced as a
    batch-summed load would say. ``types``: each sample's type (0 or 1), or one type for all."""
    q = importance.float()
    if delta:
        if types is None:
            raise ValueError("the type-wise term (delta > 0) needs the samples' types")
        types = torch.as_tensor(types, device=q.device).reshape(-1).expand(q.shape[0])
        weights = type_weights(types, q.shape[-1], delta)
        q = q * (weights if q.dim() == 2 else weights.unsqueeze(1))
    return cv_squared(q.flatten())


class MoELoRALinear(AdaptedLinear):
    """A frozen linear layer plus a mixture of LoRA experts (see the module docstring)."""

    records_routing = True

    def __init__(self, base: nn.Linear, *, kind: str = "loramoe", num_experts: int = 4,
                 top_k: int | None = 1, r: int = 8, alpha: float = 16.0, heads: int = 1,
                 top1_gate: str = "probability", dropout: float = 0.0, balance_weight: float = 0.0,
                 balance_delta: float = 0.0):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if kind == "loramoe" and heads != 1:
            raise ValueError("loramoe has one router over the whole input (heads = 1)")
        if kind == "mh_moe" and top_k is None:
            raise ValueError("mh_moe routes top-k within each head; give top_k")
        if top_k is not None and not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must lie in [1, {num_experts}], got {top_k}")
        if base.in_features % heads:
            raise ValueError(f"heads ({heads}) must divide the input width {base.in_features}")
        if top1_gate not in TOP1_GATES:
            raise ValueError(f"top1_gate must be one of {TOP1_GATES}, got {top1_gate!r}")
        if balance_delta and num_experts % 2:
            raise ValueError(f"balance_delta splits each router's experts in halves; num_experts = {num_experts} is odd")
        super().__init__(base)
        self.kind, self.top_k, self.r, self.alpha = kind, top_k, r, alpha
        self.heads, self.experts_per_head = heads, num_experts
        self.num_experts = heads * num_experts  # what the routing recorder counts
        self.top1_gate, self.balance_weight, self.balance_delta = top1_gate, balance_weight, balance_delta
        self.sample_type: int | Tensor | None = None  # LoRAMoE's task type (1: world knowledge), for δ > 0
        self.scaling = alpha / r
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        d_in, d_out, h, k = base.in_features, base.out_features, heads, num_experts
        device = base.weight.device
        self.lora_A = nn.Parameter(torch.empty(h, k, r, d_in // h, device=device))
        self.lora_B = nn.Parameter(torch.zeros(h, k, r, d_out, device=device))
        self.lora_router = nn.Parameter(torch.empty(h, k, d_in // h, device=device))
        for m in range(h):
            for j in range(k):
                nn.init.kaiming_uniform_(self.lora_A[m, j], a=math.sqrt(5))
            nn.init.kaiming_uniform_(self.lora_router[m], a=math.sqrt(5))

    def fused_weight(self) -> Tensor:
        """Router and A of every head as one block-diagonal (H·(K + K·r), d_in) matrix: block m
        holds head m's router rows (K × d_in/H) then its K experts' A (K·r × d_in/H)."""
        h, k, r, dh = self.lora_A.shape
        blocks = torch.cat([self.lora_router, self.lora_A.reshape(h, k * r, dh)], dim=1)  # (H, K + K·r, d/H)
        return blocks[0] if h == 1 else torch.block_diag(*blocks.unbind(0))

    def route(self, logits: Tensor) -> tuple[Tensor, Tensor | None, Tensor]:
        """From router logits (N, H, K): gate weights (N, H, K), zero off the selected set; the
        top-k indices (N, H, k), None when dense; the router's softmax over all K (N, H, K)."""
        # softmax written out: ATen's CPU kernel is slow on a last dimension of a few experts
        top_values, top_indices = (logits.max(-1, keepdim=True) if self.top_k == 1
                                   else logits.topk(self.top_k or 1, dim=-1))
        exp = (logits - top_values[..., :1]).exp()
        probs = exp / exp.sum(-1, keepdim=True)
        if self.top_k is None:
            return probs, None, probs
        if self.top_k == 1 and self.top1_gate == "probability":
            chosen = top_k_gates(probs, top_indices, "probability")  # Switch Transformer: p_j of the selected expert
        elif self.top_k == 1:
            chosen = top_k_gates(logits, top_indices, "one")         # Eq. 13 with k = 1: ≡ 1, no router gradient
        else:
            chosen = top_k_gates(logits, top_indices, "softmax")     # Eq. 13: renormalised over the selected set
        return dense_gates(chosen, top_indices, like=probs), top_indices, probs

    def forward(self, x: Tensor) -> Tensor:
        out = self.base_layer(x)
        shape = x.shape
        heads, k, r = self.heads, self.experts_per_head, self.r
        h = x.reshape(-1, shape[-1]).to(self.lora_A.dtype)
        if isinstance(self.dropout, nn.Identity):  # routers and experts in one GEMM
            fused = (h @ self.fused_weight().T).view(-1, heads, k + k * r)
            logits, codes = fused[..., :k], fused[..., k:]
        else:  # the router reads the undropped input, the experts the dropped one
            w = self.fused_weight().view(heads, k + k * r, -1)
            logits = (h @ torch.block_diag(*w[:, :k].unbind(0)).T).view(-1, heads, k)
            codes = self.dropout(h) @ torch.block_diag(*w[:, k:].unbind(0)).T
        weights, chosen, probs = self.route(logits)  # (N, H, K)
        if routing.is_recording():
            self._record(probs, chosen)
        if self.balance_weight and auxiliary.is_collecting():
            auxiliary.add("balance", self.balance_weight * self._balance(weights, shape))
        codes = (codes.reshape(-1, heads, k, r) * weights.unsqueeze(-1)).reshape(-1, heads * k * r)
        delta = (codes @ self.lora_B.view(heads * k * r, -1)) * self.scaling
        return out + delta.reshape(*shape[:-1], -1).to(out.dtype)

    def _balance(self, weights: Tensor, shape: torch.Size) -> Tensor:
        """The localized balancing term of this forward: samples are the input's first dimension
        (one sample per row of a 2-D input), tokens the rest; padding tokens count nothing."""
        batch = shape[0] if len(shape) > 1 else 1
        per_token = weights.reshape(batch, -1, self.heads, self.experts_per_head)
        mask = routing.token_mask(batch, per_token.shape[1])
        if mask is not None:
            per_token = per_token * mask.to(per_token.device, per_token.dtype).view(batch, -1, 1, 1)
        return localized_balance(per_token.sum(1), self.sample_type, self.balance_delta)

    def _record(self, probs: Tensor, chosen: Tensor | None) -> None:
        n = probs.shape[0]
        if chosen is None:  # dense gating: the argmax is the decision
            chosen = probs.argmax(-1, keepdim=True)
        offsets = torch.arange(self.heads, device=chosen.device).view(1, -1, 1) * self.experts_per_head
        routing.record(self, experts=(chosen + offsets).reshape(n, -1), gates=probs.reshape(n, -1) / self.heads)

    def param_counts(self) -> dict[str, int]:
        return param_counts(self.in_features, self.out_features, kind=self.kind, num_experts=self.experts_per_head,
                            top_k=self.top_k, r=self.r, heads=self.heads)

    def extra_repr(self) -> str:
        return (f"kind={self.kind}, in={self.in_features}, out={self.out_features}, heads={self.heads}, "
                f"experts={self.experts_per_head}, top_k={self.top_k}, r={self.r}, scaling={self.scaling:g}")


# -- parameter counts and budgets ---------------------------------------------------------------
def param_counts(d_in: int, d_out: int, *, kind: str, num_experts: int, top_k: int | None, r: int,
                 heads: int = 1) -> dict[str, int]:
    """Trainable parameters of one layer: ``total`` and ``active`` per token.

    Active counts the experts a token uses (k per slice; all K when gating is dense) and every
    router weight (each token's logits read all of them). ``kind="lora"`` is one plain LoRA."""
    if kind == "lora":
        return {"total": r * (d_in + d_out), "active": r * (d_in + d_out)}
    expert = r * (d_in // heads + d_out)
    router = num_experts * d_in  # H routers of K × d_in/H
    used = num_experts if top_k is None else top_k
    return {"total": heads * num_experts * expert + router, "active": heads * used * expert + router}


def rank_for_budget(budget: int, shapes: Iterable[tuple[int, int]], **layer) -> int:
    """The LoRA rank r ≥ 1 whose active parameters over ``shapes`` ((d_in, d_out) per adapted
    layer) come closest to ``budget`` (ties go to the smaller rank). ``layer``: ``kind``,
    ``num_experts``, ``top_k``, ``heads`` as in :func:`param_counts`."""
    shapes = list(shapes)

    def active(r: int) -> int:
        return sum(param_counts(i, o, r=r, **layer)["active"] for i, o in shapes)

    r = 1
    while active(r + 1) <= budget:
        r += 1
    return r + 1 if abs(active(r + 1) - budget) < abs(active(r) - budget) else r


# -- injection --------------------------------------------------------------------------------
def moe_layers(model: nn.Module) -> list[MoELoRALinear]:
    return [m for m in model.modules() if isinstance(m, MoELoRALinear)]


def inject(model: nn.Module, target_modules: list[str], layers: list[int] | None = None,
           **layer) -> list[str]:
    """Replace each matching frozen linear by an :class:`MoELoRALinear`; returns their names."""
    return replace_linears(model, target_modules, layers, lambda linear: MoELoRALinear(linear, **layer))
