"""The MoE learner of "Theory on Mixture-of-Experts in Continual Learning" (Li et al.,
Algorithm 1). It has one implementation, :func:`moe_round`, used in two places.
:class:`MoETheory` applies it step by step through the runner, one experience per round.
:func:`simulate` applies it vectorised over seeds for paper-scale curves (Fig. 2, App. A.7).

Per round ``t`` (batched over ``B`` runs):

1. Gate with uniform routing noise, Eq. 1: ``m_t = argmax_m theta_m^T xbar_t + r_m``, where
   ``r_m ~ Unif[0, lam]`` and ``xbar_t = sum_i X_{t,i}``. Routing is per task.
2. Minimum-norm update of expert ``m_t`` only, Eq. 5:
   ``w <- w + X (X^T X)^{-1} (y - X^T w)``.
3. Gating gradient of the locality loss (Eq. 6) plus the load-balance loss (Eq. 7), in closed
   form (App. D):
   ``grad_m = (||w_t - w_{t-1}|| + alpha M f_{m_t} / t) pi_{m_t} (1{m=m_t} - pi_m) xbar_t``.
   The training loss has no gradient in theta. The gradients sum to zero across experts, so
   ``sum_m theta_m = 0`` after every round (Lemma 4).
4. Early termination, lines 6-11, when ``terminate`` is set. After the ``explore`` rounds
   (``T_1 = ceil(M / eta)``), every expert whose noiseless gate output lies within ``gamma`` of
   the chosen expert's gets a sticky flag. Once all flags are set, theta is frozen for good.
   Without termination, theta is updated every round.

Choices where the paper leaves room:

* ``gamma`` defaults to ``sigma0^1.25 = 0.318`` (``sigma0 = 0.4``). That is Algorithm 1's order
  with constant 1, because Fig. 2 does not state its Gamma. ``eta = alpha = 0.5`` and
  ``lam = 0.3`` are Fig. 2's values.
* ``P_t`` in Eq. 7 accumulates the softmax probability of the chosen expert in each round, each
  computed with that round's theta. App. D's gradient flows only through the current round's
  term.
* In the runner, one experience is one round: the first training batch runs the round. Further
  epochs or batches do nothing, because a round has one routing decision. The batch must hold
  the whole round (``train.batch_size >= s``).
* The model predicts round ``tau``'s test inputs with the expert ``m_tau`` that learned it, as
  Eqs. 14-16 do. A round not yet learned is routed by the noiseless gate on its ``xbar``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated

import torch
from pydantic import Field
from torch import Tensor, nn

from clbench import ArgumentError, Strategy
from clbench.errors import UserError
from clbench.models.routing_channel import record as record_routing


NOISE_SALT = 2 ** 40  # routing noise is drawn from seed + salt, apart from the data's seed


def routing_noise(seed: int, rounds: int, num_experts: int, lam: float) -> Tensor:
    """``r_t^{(m)} ~ Unif[0, lam]`` for every round, ``(rounds, M)``. The simulation and the
    strategy draw the same table from a seed."""
    g = torch.Generator().manual_seed(seed + NOISE_SALT)
    return lam * torch.rand(rounds, num_experts, generator=g, dtype=torch.float64)


def default_explore(num_experts: int, eta: float) -> int:
    """``T_1 = ceil(M / eta)``, the exploration rounds before termination may start."""
    return math.ceil(num_experts / eta - 1e-9)


@dataclass
class GateState:
    """What Algorithm 1 carries between rounds besides experts and gate, for ``B`` runs."""

    counts: Tensor            # (B, M) rounds routed to each expert (t f_t)
    prob_sum: Tensor          # (B, M) sum of pi_{m_tau} over rounds routed to m (t P_t)
    flags: Tensor             # (B, M) bool, the sticky convergence flags I^{(m)}
    frozen: Tensor            # (B,) bool, gating terminated
    stopped_at: Tensor        # (B,) round (1-based) whose flags froze the gate; 0 if none
    t: int = 0

    @classmethod
    def zeros(cls, runs: int, num_experts: int) -> "GateState":
        f64 = torch.float64
        return cls(torch.zeros(runs, num_experts, dtype=f64), torch.zeros(runs, num_experts, dtype=f64),
                   torch.zeros(runs, num_experts, dtype=torch.bool), torch.zeros(runs, dtype=torch.bool),
                   torch.zeros(runs, dtype=torch.long))

    def state_dict(self) -> dict:
        return {"counts": self.counts, "prob_sum": self.prob_sum, "flags": self.flags, "frozen": self.frozen,
                "stopped_at": self.stopped_at, "t": self.t}


@dataclass
class RoundInfo:
    expert: Tensor = field(default=None)   # (B,) m_t
    gate: Tensor = field(default=None)     # (B, M) h before the update
    drift: Tensor = field(default=None)    # (B,) ||w_t - w_{t-1}|| of the chosen expert
    loss: Tensor = field(default=None)     # (B,) Eq. 8 after the expert update


def moe_round(experts: Tensor, theta: Tensor, state: GateState, X: Tensor, y: Tensor, noise: Tensor, *,
              eta: float, alpha: float, gamma: float, terminate: bool, explore: int) -> RoundInfo:
    """One round of Algorithm 1 for ``B`` runs. Updates ``experts``/``theta`` (``(B, M, d)``) and
    ``state`` in place. ``X`` is ``(B, d, s)``, ``y`` is ``(B, s)`` and ``noise`` is ``(B, M)``."""
    state.t += 1
    t, M = state.t, experts.shape[1]
    rows = torch.arange(experts.shape[0])
    xbar = X.sum(-1)
    h = torch.einsum("bmd,bd->bm", theta, xbar)
    m = (h + noise).argmax(-1)
    old = experts[rows, m]
    residual = y - torch.einsum("bds,bd->bs", X, old)
    step = torch.einsum("bds,bs->bd", X, torch.linalg.solve(X.transpose(1, 2) @ X, residual))
    experts[rows, m] = old + step
    drift = step.norm(dim=-1)
    pi = h.softmax(-1)
    pi_m = pi[rows, m]
    state.counts[rows, m] += 1
    state.prob_sum[rows, m] += pi_m
    f_m = state.counts[rows, m] / t
    loss = pi_m * drift + alpha * M * (state.counts * state.prob_sum).sum(-1) / t ** 2
    if terminate and t > explore:
        near = (h - h[rows, m][:, None]).abs() < gamma
        state.flags |= near & ~state.frozen[:, None]
        newly = state.flags.all(-1) & ~state.frozen
        state.stopped_at[newly] = t
        state.frozen |= newly
    active = ~state.frozen
    if active.any():
        onehot = torch.nn.functional.one_hot(m, M).to(pi.dtype)
        weight = (drift + alpha * M * f_m / t) * pi_m * active.to(pi.dtype)
        grad = (weight[:, None] * (onehot - pi))[:, :, None] * xbar[:, None, :]
        theta -= eta * grad
    return RoundInfo(expert=m, gate=h, drift=drift, loss=loss)


def simulate(seeds: list[int], rounds: int, num_experts: int, *, terminate: bool = True, eta: float = 0.5,
             alpha: float = 0.5, lam: float = 0.3, gamma: float = 0.4 ** 1.25, explore: int | None = None,
             noise_seeds: list[int] | None = None, **stream_args) -> dict[str, Tensor]:
    """Algorithm 1 on ``len(seeds)`` independent streams at once. Seed ``s`` draws the data of
    ``moe_regression(seed=s)``, and the routing noise from ``noise_seeds`` (default: ``seeds``).
    A runner run draws its noise from its strategy seed,
    ``clbench.seeding.derive(run_seed, "strategy")``. Pass that seed to reproduce the run.

    Returns per-round ``(B, T)`` tensors: ``expert``, ``task``, ``error`` (E_t), ``forgetting``
    (F_t), ``generalisation`` (G_t), ``theta_sum`` (max |sum_m theta_m|) and ``gate_step``
    (``||theta_{t+1} - theta_t||``). It also returns
    ``stopped_at`` ``(B,)``, and ``experts``/``theta``/``truths``/``clusters`` at the end.
    """
    from clbench.benchmarks.moe_regression import make_stream
    from clbench.metrics.theory import RoundErrors

    streams = [make_stream(s, rounds, **stream_args) for s in seeds]
    X = torch.stack([s.X for s in streams])
    y = torch.stack([s.y for s in streams])
    tasks = torch.stack([s.tasks for s in streams])
    truths = torch.stack([s.truths for s in streams])
    noise = torch.stack([routing_noise(s, rounds, num_experts, lam) for s in (noise_seeds or seeds)])
    B, d = len(seeds), X.shape[2]
    experts = torch.zeros(B, num_experts, d, dtype=torch.float64)
    theta = torch.zeros_like(experts)
    state = GateState.zeros(B, num_experts)
    errors = RoundErrors(truths, num_experts)
    explore = default_explore(num_experts, eta) if explore is None else explore
    out = {k: torch.zeros(B, rounds, dtype=torch.float64) for k in ("error", "forgetting", "generalisation",
                                                                      "theta_sum", "gate_step")}
    out["expert"] = torch.zeros(B, rounds, dtype=torch.long)
    for t in range(rounds):
        previous = theta.clone()
        info = moe_round(experts, theta, state, X[:, t], y[:, t], noise[:, t], eta=eta, alpha=alpha, gamma=gamma,
                         terminate=terminate, explore=explore)
        e, f, g = errors.update(experts, info.expert, tasks[:, t])
        out["error"][:, t], out["forgetting"][:, t], out["generalisation"][:, t] = e, f, g
        out["theta_sum"][:, t] = theta.sum(1).abs().amax(-1)
        out["gate_step"][:, t] = (theta - previous).flatten(1).norm(dim=-1)
        out["expert"][:, t] = info.expert
    return {**out, "task": tasks, "stopped_at": state.stopped_at, "experts": experts, "theta": theta,
            "truths": truths, "clusters": torch.stack([s.clusters for s in streams]), "explore": explore}


class MoETheoryModel(nn.Module):
    """``M`` linear experts and a linear gate held as buffers (closed-form learner: no parameters,
    so no optimizer is built). Reads inputs ``[x (d), xbar (d), round]`` (``moe-regression``)."""

    records_routing = True

    def __init__(self, input_shape: tuple[int, ...], output_dim: int = 1, num_experts: int = 5,
                 max_rounds: int = 4096):
        super().__init__()
        if output_dim != 1 or (input_shape[0] - 1) % 2:
            raise UserError(f"moe_theory reads [x, xbar, round] inputs with one output, got input_shape "
                            f"{tuple(input_shape)} and output_dim {output_dim}", where="model",
                            fix="use it with the moe-regression benchmark")
        self.dim = (input_shape[0] - 1) // 2
        self.num_experts = num_experts
        self.register_buffer("experts", torch.zeros(num_experts, self.dim, dtype=torch.float64))
        self.register_buffer("theta", torch.zeros(num_experts, self.dim, dtype=torch.float64))
        self.register_buffer("routed", torch.full((max_rounds,), -1, dtype=torch.long))

    def split(self, inputs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        d = self.dim
        rounds = inputs[:, -1].long()
        if int(rounds.max()) >= len(self.routed):
            raise ArgumentError("model", "max_rounds", f"round {int(rounds.max())} is beyond max_rounds="
                                f"{len(self.routed)}", fix="raise max_rounds to the stream's rounds")
        return inputs[:, :d].double(), inputs[:, d:2 * d].double(), rounds

    def forward(self, inputs: Tensor) -> Tensor:
        x, xbar, rounds = self.split(inputs)
        expert = self.routed[rounds]
        unseen = expert < 0
        if unseen.any():
            expert = torch.where(unseen, (xbar @ self.theta.T).argmax(-1), expert)
        record_routing(self, experts=expert[:, None])
        return (x * self.experts[expert]).sum(-1)


def moe_theory_model(input_shape, output_dim: int = 1, num_experts: Annotated[int, Field(ge=1)] = 5,
                     max_rounds: Annotated[int, Field(ge=1)] = 4096):
    """Model factory (config ``model: {class_path: clbench.strategies.moe_theory:moe_theory_model}``)."""
    return MoETheoryModel(input_shape, output_dim, num_experts, max_rounds)


class MoETheory(Strategy):
    """Algorithm 1 round by round: one experience is one round (see the module docstring).

    ``eta``: gating step size. ``alpha``: load-balance weight. ``lam``: routing-noise range.
    ``gamma``: termination threshold. ``terminate``: early termination on or off. ``explore``:
    ``T_1`` (None: ``ceil(M / eta)``). The step size is positive (a negative one climbs the
    locality loss; zero never trains the gate and makes ``T_1`` infinite); the others are >= 0.
    """

    owns_update = True
    requires = frozenset({"regression"})  # the theory's linear experts fit real-valued labels
    supports_distributed = False  # one routing decision per round: batches are not split

    def __init__(self, eta: Annotated[float, Field(gt=0)] = 0.5, alpha: Annotated[float, Field(ge=0)] = 0.5,
                 lam: Annotated[float, Field(ge=0)] = 0.3, gamma: Annotated[float, Field(ge=0)] = 0.4 ** 1.25,
                 terminate: bool = True, explore: Annotated[int, Field(ge=0)] | None = None):
        super().__init__()
        self.eta, self.alpha, self.lam, self.gamma = eta, alpha, lam, gamma
        self.terminate, self.explore = terminate, explore
        self.state: GateState | None = None
        self.done = False

    def setup(self, ctx, experiences, seed: int) -> None:
        super().setup(ctx, experiences, seed)
        model = ctx.model
        if not isinstance(model, MoETheoryModel):
            raise UserError(f"moe_theory needs its own model, got {type(model).__name__}", where="model.class_path",
                            fix="use model: {class_path: clbench.strategies.moe_theory:moe_theory_model}")
        self.noise = routing_noise(seed, len(experiences), model.num_experts, self.lam)
        self.state = GateState.zeros(1, model.num_experts)
        self.t1 = default_explore(model.num_experts, self.eta) if self.explore is None else self.explore

    def before_experience(self, ctx, experience) -> None:
        self.done = False
        self.samples = len(experience.train)

    def update(self, ctx, batch) -> Tensor:
        model = ctx.model
        inputs, y = batch
        if self.done:  # a later epoch of the same round: nothing more to learn
            return torch.zeros((), dtype=torch.float64)
        if inputs.shape[0] != self.samples:
            raise UserError(f"a batch of {inputs.shape[0]} samples holds only part of a round of {self.samples}",
                            where="train.batch_size", fix=f"set train.batch_size >= {self.samples}")
        x, _, rounds = model.split(inputs)
        info = moe_round(model.experts[None], model.theta[None], self.state, x.T[None], y.double()[None],
                         self.noise[self.state.t][None], eta=self.eta, alpha=self.alpha, gamma=self.gamma,
                         terminate=self.terminate, explore=self.t1)
        model.routed[rounds[0]] = info.expert[0]
        record_routing(model, experts=info.expert[:, None])
        self.done = True
        return info.loss[0]

    def state_dict(self) -> dict:
        return self.state.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.state = GateState(**{k: (v.clone() if torch.is_tensor(v) else v) for k, v in state.items()})
