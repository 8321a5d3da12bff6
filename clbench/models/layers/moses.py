"""Mixture-of-SubExperts layers (MoSEs): sparse LoRA sub-experts under per-task binary masks.

:class:`MoSELinear` replaces a frozen ``nn.Linear`` (kept as ``base_layer``) by (Eq. 5)

    h = base(x) + β · Σ_{j ∈ TopK(R̂(x))} R̂_j(x) · (x (A_j ⊙ ξ_j^t)ᵀ)(B_j ⊙ ξ_j^t),   β = α / r

with N rank-r LoRA sub-experts ``lora_A`` (N, r, d_in), ``lora_B`` (N, r, d_out) and a bias-free
router ``lora_router`` (N, d_in) whose logits are ``x (W ⊙ δ^t)ᵀ`` (Eq. 4). The masks
m^t = {δ^t, ξ^t} are the top-c fraction of learnable score tensors ``score_*`` of the same shapes,
one mask per weight tensor of the layer ("top-c% of each weight score function", Algorithm 1
line 12), as in Winning SubNetworks.

Choices where the paper is silent:

* Masks cover A, B and the router alike (the paper masks "router and expert weights").
* Gates are the softmax over the k selected logits (renormalised; with the main E2T2 setting,
  N = k = 2, every token uses both experts).
* Which entries are the "top-c%": those of largest *absolute* score, as in Winning SubNetworks'
  ``GetSubnet`` (the same authors' method, whose masks MoSEs' follow; WSN applies it to
  ``scores.abs()``). The paper says only "top-c% of each weight score function"; the scores start
  Kaiming-uniform with either sign, so ranking the signed values would keep other entries
  (for scores [-0.9, 0.1, 0.2, -0.05] and c = 0.5: [1, 0, 1, 0], not [0, 1, 1, 0]).
* The count kept is WSN's: with the pruned fraction 1 − c, WSN keeps the entries at or above the
  (1 + round((1 − c)(n − 1)))-th smallest |s|, i.e. ``n − round((1 − c)(n − 1))`` of n entries
  (:func:`kept_count`; Python's round, halves to even; at least one). Ties at the threshold are
  broken by ``topk`` (WSN would keep every tied entry; continuous scores make that moot).
* The gradient through the top-c selection is WSN's straight-through estimator: the forward uses
  the binary mask of |s|, the backward passes the mask's gradient unchanged to |s|, so
  ∂L/∂s = ∂L/∂(θ ⊙ m) ⊙ θ ⊙ sign(s).
* c is the kept fraction (density; WSN's ``1 − sparsity``).

Task state: ``mask_*`` buffers hold one stored mask per task slot (T, ...), saved with the model.
While training (``state.training_slot`` set and the layer in training mode) the mask comes from
the live scores through the straight-through estimator; otherwise every sample ``i`` uses the
stored mask of ``state.slots[i]`` (samples of different tasks in one batch are grouped by task).
``state`` is a :class:`TaskState` shared by every layer and owned by the strategy.

Routing record: a unit's route (for N_eff) is its task slot followed by its top-k experts. MoSEs
routes in two steps, the key choosing the task's masked subspace and the router the experts
inside it; recording the experts alone would make E2T2's top-2 of 2 one route for every task.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from clbench.models.gating import dense_gates, top_k_gates
from clbench.models.layers.adapted import AdaptedLinear, replace_linears
from clbench.models import routing_channel as routing

NAMES = ("A", "B", "router")


class TaskState:
    """Which task slot(s) the MoSE layers and the prompt use for the current forward pass."""

    def __init__(self) -> None:
        self.training_slot: int | None = None  # the task being trained (live scores, STE)
        self.slots: Tensor | None = None        # per-sample slot in evaluation; None: no adapter


class _TopC(torch.autograd.Function):
    """Binary mask of the top-c fraction of ``magnitudes``; straight-through gradient."""

    @staticmethod
    def forward(ctx, scores: Tensor, c: float) -> Tensor:
        return top_c(scores.detach(), c).to(scores.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


def kept_count(n: int, c: float) -> int:
    """How many of ``n`` entries a density-c mask keeps: WSN's ``n − round((1 − c)(n − 1))``."""
    return max(1, n - round((1.0 - c) * (n - 1)))


def top_c(scores: Tensor, c: float) -> Tensor:
    """Boolean mask of the :func:`kept_count` entries of ``scores`` with the largest |s| (WSN)."""
    flat = scores.flatten().abs()
    mask = torch.zeros_like(flat, dtype=torch.bool)
    mask[flat.topk(kept_count(flat.numel(), c)).indices] = True
    return mask.view_as(scores)


def straight_through_mask(scores: Tensor, c: float) -> Tensor:
    """The top-c mask of |scores| with WSN's gradient: straight through to |s|, so ·sign(s) to s."""
    return _TopC.apply(scores.abs(), c)


class MoSELinear(AdaptedLinear):
    """A frozen linear layer plus N sparse LoRA sub-experts (see the module docstring)."""

    records_routing = True

    def __init__(self, base: nn.Linear, state: TaskState, *, num_tasks: int, num_experts: int = 2,
                 top_k: int = 2, r: int = 2, alpha: float = 8.0, density: float = 0.3):
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must lie in [1, {num_experts}], got {top_k}")
        super().__init__(base)
        self.state = state
        self.num_experts, self.top_k, self.r, self.density = num_experts, top_k, r, density
        self.scaling = alpha / r
        n, d_in, d_out, dev = num_experts, base.in_features, base.out_features, base.weight.device
        shapes = {"A": (n, r, d_in), "B": (n, r, d_out), "router": (n, d_in)}
        for name, shape in shapes.items():
            self.register_parameter(f"lora_{name}", nn.Parameter(torch.zeros(shape, device=dev)))
            self.register_parameter(f"score_{name}", nn.Parameter(torch.zeros(shape, device=dev)))
            self.register_buffer(f"mask_{name}", torch.zeros((num_tasks, *shape), dtype=torch.bool, device=dev))
        for j in range(n):
            nn.init.kaiming_uniform_(self.lora_A[j], a=math.sqrt(5))
        self.reset_router()
        self.reset_scores()

    # -- per-task state -----------------------------------------------------------------------
    @torch.no_grad()
    def reset_scores(self) -> None:
        for name in NAMES:
            nn.init.kaiming_uniform_(getattr(self, f"score_{name}"), a=math.sqrt(5))

    @torch.no_grad()
    def reset_router(self, keep: Tensor | None = None) -> None:
        """Re-initialise the router like ``nn.Linear``, except the entries where ``keep`` is True."""
        fresh = torch.empty_like(self.lora_router)
        nn.init.kaiming_uniform_(fresh, a=math.sqrt(5))
        self.lora_router.copy_(fresh if keep is None else torch.where(keep, self.lora_router, fresh))

    @torch.no_grad()
    def store_mask(self, slot: int) -> None:
        """Write the top-c masks of the live scores into task ``slot``'s stored masks."""
        for name in NAMES:
            getattr(self, f"mask_{name}")[slot] = top_c(getattr(self, f"score_{name}"), self.density)

    def used(self, slots: list[int]) -> dict[str, Tensor]:
        """Per weight tensor, the union of the stored masks of ``slots`` (the protected entries)."""
        return {name: getattr(self, f"mask_{name}")[slots].any(0) if slots else
                torch.zeros_like(getattr(self, f"mask_{name}")[0]) for name in NAMES}

    def weights(self, slot: int | None) -> tuple[Tensor, Tensor, Tensor]:
        """(A, B, router) ⊙ mask: the live straight-through mask when ``slot`` is None."""
        out = []
        for name in NAMES:
            w = getattr(self, f"lora_{name}")
            if slot is None:
                mask = straight_through_mask(getattr(self, f"score_{name}"), self.density)
            else:
                mask = getattr(self, f"mask_{name}")[slot].to(w.dtype)
            out.append(w * mask)
        return tuple(out)

    # -- forward ----------------------------------------------------------------------------
    def route(self, logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Gates (M, N), zero off the top-k; the top-k indices (M, k); the softmax over all N."""
        top_indices = logits.topk(self.top_k, dim=-1).indices
        gates = dense_gates(top_k_gates(logits, top_indices, "softmax"), top_indices, like=logits)
        return gates, top_indices, logits.softmax(-1)

    def mixture(self, h: Tensor, slot: int | None) -> tuple[Tensor, Tensor, Tensor]:
        """β · MoSE(h) for tokens ``h`` (M, d_in) under one task's masks; its top-k indices (M, k)
        and router softmax (M, N) for the routing record."""
        a, b, router = self.weights(slot)
        gates, chosen, probs = self.route(h @ router.T)
        codes = torch.einsum("md,nrd->mnr", h, a) * gates.unsqueeze(-1)
        return (codes.flatten(1) @ b.flatten(0, 1)) * self.scaling, chosen, probs

    def forward(self, x: Tensor) -> Tensor:
        out = self.base_layer(x)
        state = self.state
        if self.training and state.training_slot is not None:
            delta, chosen, probs = self.mixture(x.reshape(-1, x.shape[-1]).to(self.lora_A.dtype), None)
            self._record(chosen, probs, state.training_slot)
            return out + delta.view(*x.shape[:-1], -1).to(out.dtype)
        slots = state.slots
        if slots is None:
            return out
        # Samples of different tasks go through their own masks, group by group; the routing is
        # put back in batch order and recorded once, so its units line up with the batch's
        # (padding and labels, clbench.models.routing_channel.units).
        lead = x.shape[:-1]
        delta = torch.zeros(*lead, self.out_features, dtype=self.lora_A.dtype, device=x.device)
        chosen = torch.zeros(*lead, self.top_k, dtype=torch.long, device=x.device)
        probs = torch.zeros(*lead, self.num_experts, dtype=delta.dtype, device=x.device)
        for slot in slots.unique().tolist():
            rows = (slots == slot).nonzero().squeeze(1)
            xs = x[rows]
            d, c, p = self.mixture(xs.reshape(-1, x.shape[-1]).to(delta.dtype), slot)
            delta[rows] = d.view(*xs.shape[:-1], -1).to(delta.dtype)  # bf16 under autocast
            chosen[rows], probs[rows] = c.view(*xs.shape[:-1], -1), p.view(*xs.shape[:-1], -1).to(probs.dtype)
        self._record(chosen.reshape(-1, self.top_k), probs.reshape(-1, self.num_experts),
                     slots.view(-1, *([1] * (len(lead) - 1))).expand(lead))
        return out + delta.to(out.dtype)

    def _record(self, chosen: Tensor, probs: Tensor, slots: Tensor | int) -> None:
        """A unit's route is (the task slot whose masks it ran under, its experts): sub-expert j
        under two tasks' masks is two different sets of weights. ``slots``: one per unit (any
        shape with that many entries), or one slot for them all (training)."""
        if routing.is_recording():
            units = torch.full((chosen.shape[0],), slots, device=chosen.device) if isinstance(slots, int) \
                else slots.reshape(-1)
            routing.record(self, experts=chosen, gates=probs, subspace=units)

    def param_counts(self) -> dict[str, int]:
        """Learnable weights (A, B, router; scores not counted) and those one task's masks keep."""
        total = sum(getattr(self, f"lora_{n}").numel() for n in NAMES)
        kept = sum(kept_count(getattr(self, f"lora_{n}").numel(), self.density) for n in NAMES)
        return {"total": total, "per_task": kept}

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, experts={self.num_experts}, "
                f"top_k={self.top_k}, r={self.r}, density={self.density:g}, scaling={self.scaling:g}")


def inject(model: nn.Module, target_modules: list[str], layers: list[int] | None, state: TaskState,
           **layer) -> list[str]:
    """Replace each matching frozen ``nn.Linear`` by a :class:`MoSELinear`; returns their names."""
    return replace_linears(model, target_modules, layers, lambda linear: MoSELinear(linear, state, **layer))


def mose_layers(model: nn.Module) -> list[MoSELinear]:
    return [m for m in model.modules() if isinstance(m, MoSELinear)]
