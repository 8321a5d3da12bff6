"""Routers of the thesis's MoE vision transformers: ``switch`` and ``ema_centroid``.

A router maps routing units (images or tokens, as rows of ``feats (U, D)``) to a decision::

    experts, gates, probs = router(feats)   # (U, k) long, (U, k) combine weights, (U, E) or None

``gates`` are the weights the MoE layer combines the chosen experts' outputs with; ``probs``
are the router's probabilities over all experts (recorded for routing metrics). A router adds
its own auxiliary losses with :func:`clbench.models.auxiliary.add` (a no-op outside a training step).

Choices (the thesis leaves these open; each is an option where it plausibly changes results):

* Combining the top-k outputs (the formulas live in :mod:`clbench.models.gating`). The thesis:
  "the experts output when multiple experts is added and normalized", so the top-k
  probabilities are renormalized to sum to 1. With top-1 that weight is exactly 1 and
  carries no gradient, and the router would learn from the balance loss only.
  ``gate="straight_through"`` (default) keeps the thesis's forward value
  and passes the task gradient as Switch Transformer's raw-probability gate does
  (``g = normalized + p - p.detach()``); ``"normalized"`` is the literal reading, ``"raw"``
  is Switch Transformer (output scaled by ``p``, so copies of a dense MLP no longer equal it).
* Balance loss. :math:`L_{balance} = \\sum_e p_e \\log(p_e N)` (KL from uniform), where
  :math:`p_e` is the fraction of units assigned to expert e in the batch. Hard fractions
  have no gradient, so by default :math:`p_e` is the batch mean of the router probabilities
  (``balance_on="probs"``); ``"assignments"`` uses the hard top-k fractions (a monitor only).
* Annealing :math:`\\lambda_{lb}(t)=\\lambda_0 \\max(0, 1-t/T_{anneal})`: ``t`` counts this
  router's training forwards (one per optimizer step in the harness; kept in a buffer so it
  survives checkpoints), ``T_anneal = anneal_steps`` in optimizer steps (the thesis's
  ``moe_anneal_epochs`` is in epochs); ``anneal_steps=0`` keeps :math:`\\lambda_0` constant.
* Router learning rate ("a reduced router learning rate" stabilised the standard MoE):
  ``lr_mult`` stores the router weight divided by ``lr_mult`` and multiplies it back in the
  forward pass. Under Adam/AdamW (updates invariant to the gradient's scale) the effective
  learning rate is ``lr_mult`` times the optimizer's; under plain SGD it is ``lr_mult**2``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from clbench.models import auxiliary
from clbench.models.gating import top_k_gates

# the `gate` option -> its formula in clbench.models.gating
GATES = {"straight_through": "straight_through", "normalized": "normalized", "raw": "probability"}


def balance_loss(fractions: Tensor) -> Tensor:
    """KL divergence of the expert fractions ``(E,)`` from uniform: sum_e p_e log(p_e E)."""
    num = fractions.shape[-1]
    return torch.xlogy(fractions, fractions * num).sum(-1)


def annealed_weight(weight: float, step: int, anneal_steps: int) -> float:
    """lambda_lb(t) = lambda0 * max(0, 1 - t / T_anneal); constant when T_anneal is 0."""
    if anneal_steps <= 0:
        return float(weight)
    return float(weight) * max(0.0, 1.0 - step / anneal_steps)


class _Router(nn.Module):
    """Shared bookkeeping: top-k, gate mode and the annealed balance loss."""

    def __init__(self, dim: int, num_experts: int, top_k: int = 1, gate: str = "straight_through",
                 balance_weight: float = 0.01, anneal_steps: int = 0, balance_on: str = "probs"):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must lie in [1, num_experts={num_experts}], got {top_k}")
        if gate not in GATES:
            raise ValueError(f"gate must be one of {tuple(GATES)}, got {gate!r}")
        if balance_on not in ("probs", "assignments"):
            raise ValueError(f"balance_on must be 'probs' or 'assignments', got {balance_on!r}")
        self.dim, self.num_experts, self.top_k, self.gate = dim, num_experts, top_k, gate
        self.balance_weight, self.anneal_steps, self.balance_on = balance_weight, anneal_steps, balance_on
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    def current_balance_weight(self) -> float:
        return annealed_weight(self.balance_weight, int(self.step), self.anneal_steps)

    def _balance(self, probs: Tensor, experts: Tensor) -> None:
        weight = self.current_balance_weight()
        if weight == 0.0 or not auxiliary.is_collecting():
            return
        if self.balance_on == "probs":
            fractions = probs.float().mean(0)
        else:
            fractions = torch.bincount(experts.reshape(-1), minlength=self.num_experts).float()
            fractions = fractions / fractions.sum()
        auxiliary.add("balance", weight * balance_loss(fractions))

    def _tick(self) -> None:
        if self.training:
            self.step += 1


class SwitchRouter(_Router):
    """A linear router (no bias), softmax, top-k; the thesis's "standard MoE" router.

    Its only auxiliary loss is the annealed balance loss. ``lr_mult`` scales the router's
    effective learning rate (see the module notes).
    """

    def __init__(self, dim: int, num_experts: int, top_k: int = 1, lr_mult: float = 1.0, **kwargs):
        super().__init__(dim, num_experts, top_k, **kwargs)
        if lr_mult <= 0:
            raise ValueError(f"lr_mult must be > 0, got {lr_mult}")
        self.lr_mult = float(lr_mult)
        self.weight = nn.Parameter(torch.empty(num_experts, dim))
        nn.init.trunc_normal_(self.weight, std=0.02)
        with torch.no_grad():
            self.weight.div_(self.lr_mult)

    def forward(self, feats: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        weight = self.weight if self.lr_mult == 1.0 else self.weight * self.lr_mult
        probs = F.linear(feats, weight).float().softmax(-1)
        experts = probs.topk(self.top_k, dim=-1).indices
        gates = top_k_gates(probs, experts, GATES[self.gate])
        self._balance(probs, experts)
        self._tick()
        return experts, gates, probs


class EMACentroidRouter(_Router):
    """The thesis's variant 1 ("EMA router"): fast and slow EMA centroids per expert.

    Routing (image level in the thesis): score_e = beta * cos(z, c_fast_e) + (1 - beta) *
    cos(z, c_slow_e), top-k by score (``blend="centroid"`` instead scores cos(z, beta c_fast
    + (1 - beta) c_slow): the thesis's sentence admits both). Combine weights and recorded
    probabilities come from ``softmax(score / temperature)``.

    Updates (training forwards only, like BatchNorm's running statistics): for each expert e
    that received units, ``c_fast_e <- alpha_fast c_fast_e + (1 - alpha_fast) mean_e(z)``
    with ``mean_e`` the mean of the units routed (top-1) to e in the batch, then ``c_slow_e <-
    alpha_slow c_slow_e + (1 - alpha_slow) c_fast_e``; experts that received nothing keep
    their centroids. Initialisation: at the first training forward both centroids of expert
    e are set to unit e of that batch (one image per expert; cyclically when the batch is
    smaller). Before that, centroids are random normal (seeded by the model seed) so that an
    untrained model (the harness's initial evaluation) routes somewhere.

    Losses (each weighted by its lambda, added only during training steps):
    ``align`` = mean_i (1 - cos(z_i, c_slow_{a(i)})); ``cons`` = mean_e (1 - cos(c_fast_e,
    c_slow_e)); ``fast``/``slow`` = (1 / (N k)) sum_e sum_{j in TopK(e)} max(S_ej - margin, 0)
    over the row-normalised centroid similarities, TopK excluding e itself, k = ``repel_k``
    (capped at N - 1); ``balance`` as in the switch router. The centroids are buffers, so
    the thesis leaves their losses' gradient path open: here the losses use the centroids as
    they are after this batch's update, written as a differentiable function of the batch
    means, so the gradient reaches the encoder through ``z``; the buffers keep the detached
    values. ``detach_latent`` routes and updates with a detached ``z`` and drops the loss
    gradients (the thesis's suggestion for an unstable latent space).
    """

    def __init__(self, dim: int, num_experts: int, top_k: int = 1, alpha_fast: float = 0.9,
                 alpha_slow: float = 0.99, beta: float = 0.5, blend: str = "scores",
                 temperature: float = 0.1, margin: float = 0.5, repel_k: int = 1,
                 lambda_align: float = 0.1, lambda_cons: float = 0.1, lambda_fast: float = 0.1,
                 lambda_slow: float = 0.1, detach_latent: bool = False, balance_weight: float = 0.0,
                 **kwargs):
        super().__init__(dim, num_experts, top_k, balance_weight=balance_weight, **kwargs)
        for name, value in (("alpha_fast", alpha_fast), ("alpha_slow", alpha_slow), ("beta", beta)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {value}")
        if blend not in ("scores", "centroid"):
            raise ValueError(f"blend must be 'scores' or 'centroid', got {blend!r}")
        self.alpha_fast, self.alpha_slow, self.beta, self.blend = alpha_fast, alpha_slow, beta, blend
        self.temperature, self.margin, self.repel_k = temperature, margin, repel_k
        self.lambdas = {"align": lambda_align, "cons": lambda_cons, "fast": lambda_fast, "slow": lambda_slow}
        self.detach_latent = detach_latent
        self.register_buffer("fast", torch.randn(num_experts, dim))
        self.register_buffer("slow", self.fast.clone())
        self.register_buffer("initialized", torch.zeros((), dtype=torch.bool))

    def scores(self, z: Tensor, fast: Tensor | None = None, slow: Tensor | None = None) -> Tensor:
        fast = self.fast if fast is None else fast
        slow = self.slow if slow is None else slow
        zn = F.normalize(z.float(), dim=-1)
        if self.blend == "centroid":
            return zn @ F.normalize(self.beta * fast + (1 - self.beta) * slow, dim=-1).T
        return (self.beta * zn @ F.normalize(fast, dim=-1).T
                + (1 - self.beta) * zn @ F.normalize(slow, dim=-1).T)

    def _initialize(self, z: Tensor) -> None:
        pick = torch.arange(self.num_experts, device=z.device) % z.shape[0]
        self.fast.copy_(z.detach().float()[pick])
        self.slow.copy_(self.fast)
        self.initialized.fill_(True)

    def forward(self, feats: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        z = feats.detach() if self.detach_latent else feats
        if self.training and not bool(self.initialized):
            self._initialize(z)
        with torch.no_grad():
            score = self.scores(z)
        experts = score.topk(self.top_k, dim=-1).indices
        probs = (score / self.temperature).softmax(-1)
        gates = top_k_gates(probs, experts, GATES[self.gate])
        if self.training:
            self._update(z, experts[:, 0])
        self._balance(probs, experts)
        self._tick()
        return experts, gates, probs

    def _update(self, z: Tensor, assigned: Tensor) -> None:
        """EMA step of the centroids from this batch, and the centroid losses."""
        num = self.num_experts
        counts = torch.bincount(assigned, minlength=num)
        sums = z.float().new_zeros(num, z.shape[-1]).index_add(0, assigned, z.float())
        hit = (counts > 0)[:, None]
        means = sums / counts.clamp(min=1)[:, None]
        fast = torch.where(hit, self.alpha_fast * self.fast + (1 - self.alpha_fast) * means, self.fast)
        slow = torch.where(hit, self.alpha_slow * self.slow + (1 - self.alpha_slow) * fast, self.slow)
        self.fast.copy_(fast.detach())
        self.slow.copy_(slow.detach())
        if not auxiliary.is_collecting():
            return
        lam = self.lambdas
        if lam["align"]:
            cos = F.cosine_similarity(z.float(), slow[assigned], dim=-1)
            auxiliary.add("align", lam["align"] * (1 - cos).mean())
        if lam["cons"]:
            auxiliary.add("cons", lam["cons"] * (1 - F.cosine_similarity(fast, slow, dim=-1)).mean())
        for name, cents in (("fast", fast), ("slow", slow)):
            if lam[name] and num > 1:
                auxiliary.add(name, lam[name] * repulsion(cents, self.margin, self.repel_k))


def repulsion(centroids: Tensor, margin: float, k: int) -> Tensor:
    """(1 / (N k)) sum_e sum_{j in TopK(e), j != e} max(S_ej - margin, 0), S = C^ C^T."""
    num = centroids.shape[0]
    k = max(1, min(k, num - 1))
    normed = F.normalize(centroids, dim=-1)
    sim = normed @ normed.T
    sim = sim.masked_fill(torch.eye(num, dtype=torch.bool, device=sim.device), float("-inf"))
    top = sim.topk(k, dim=-1).values
    return (top - margin).clamp(min=0).sum() / (num * k)


ROUTERS = {"switch": SwitchRouter, "ema_centroid": EMACentroidRouter}


def make_router(name: str, dim: int, num_experts: int, top_k: int, **kwargs) -> _Router:
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r}; choose one of {sorted(ROUTERS)}")
    return ROUTERS[name](dim, num_experts, top_k, **kwargs)
