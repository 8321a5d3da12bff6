"""Synaptic Intelligence (SI).

Zenke, Poole & Ganguli 2017, "Continual Learning Through Synaptic Intelligence" (ICML). While
experience μ trains, every parameter k accumulates its share of the decrease of the task loss
along the optimisation path (Section 3), the running sum over steps

    ω_k^μ = −Σ_t g_k(t) · Δθ_k(t)

of the task-loss gradient times the step's actual update. After the experience the importance
grows by (Eq. 5) ``Ω_k ← Ω_k + ω_k^μ / ((Δ_k^μ)² + ξ)``, with Δ_k^μ the parameter's change over
the experience, ω is reset, and later training minimises (Eq. 4)

    loss + c · Σ_k Ω_k (θ_k − θ̃_k)²

with θ̃ the parameters at the end of the last experience (no ½: the paper's and the reference
code's form).

Choices:

* Gradient: g is the gradient of the unregularised loss, as in the reference code (its
  ``unreg_grads``) and the paper's definition (ω is a parameter's contribution to the change of
  the current task's loss). Implementations that take ``p.grad`` of the total loss (Avalanche,
  van de Ven's) also credit the surrogate's pull back towards θ̃ as importance for the new task.
  g is ``p.grad`` in :meth:`before_optimizer_step` minus the surrogate's analytic gradient
  ``2c Ω (θ − θ̃)``: exact after gradient accumulation (the parameters do not move between
  micro-batches) and after DDP's all-reduce (every rank adds the same surrogate gradient), taken
  after AMP's unscaling and before clipping. Whatever else the loss holds (a model's auxiliary
  terms, another method's regulariser in a subclass) counts as task loss.
* Δθ(t) is the change the optimizer actually made (momentum, Adam, weight decay, clipping
  included), read in :meth:`after_optimizer_step`, as the reference code's ``deltas``. A step
  AMP skips changes nothing and adds nothing (non-finite gradients count as 0).
* Ω is kept non-negative, as the reference code does (a ReLU on the accumulated Ω): a negative
  Ω would reward moving away from θ̃ and make the surrogate unbounded below.
* Parameters: every one that requires grad and has a gradient at a step, checked at every step,
  so a parameter another structure change adds or unfreezes is tracked from its first update;
  Δ_k is measured from its value before that update. Ω and θ̃ are kept by name; the surrogate
  covers the parameters present (see :class:`clbench.strategies.ewc.EWC`, whose online-mode
  bookkeeping with γ = 1 holds Ω and θ̃ here: ``Ω ← Ω + f``, θ̃ ← latest parameters).
* ω accumulates in at least float32 whatever the parameters' dtype: its per-step terms are tiny.
* Heads: nothing specific. On a task-incremental stream the objective masks logits outside a
  sample's task, so their rows of the shared head get no gradient and no importance from it, as
  under the masked softmax of the paper's multi-head split MNIST.
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field

from clbench import Strategy, UserError
from clbench.strategies.ewc import EWC


def _accumulator(p: torch.Tensor) -> torch.Tensor:
    return torch.zeros(p.shape, dtype=torch.promote_types(p.dtype, torch.float32), device=p.device)


class SI(Strategy):
    """Synaptic Intelligence.

    Args:
        c: surrogate strength. Default 1.0: the paper's split-MNIST value (its reference code's);
            permuted MNIST uses 0.1 (swept over {0.01, 0.1, 1}). On the default digits stream
            0.1 stays at naive's scores; 1 to 100 gain a little accuracy and forget less as c grows.
        xi: damping ξ of the importance's denominator. Default 0.1: the reference code's value
            for permuted MNIST, a single-head stream like the digits domains; its split MNIST
            and split CIFAR runs use 1e-3. A larger ξ limits Ω of parameters that barely moved.
    """

    supports_distributed = True  # every rank reads the same all-reduced gradient and update

    def __init__(self, c: Annotated[float, Field(ge=0)] = 1.0, xi: Annotated[float, Field(gt=0)] = 0.1):
        super().__init__()
        self.c = c
        self.xi = xi
        self.surrogate = EWC(mode="online", gamma=1.0)  # Ω (importance) and θ̃ (anchor), by name
        self.surrogate.method = "SI"
        self.path_integral: list[float] = []            # Σ_k ω_k per experience (diagnostics)
        self._omega: dict[str, torch.Tensor] = {}       # ω of the current experience
        self._start: dict[str, torch.Tensor] = {}       # each parameter before its first update
        self._before: dict[str, torch.Tensor] = {}      # each parameter before the current step
        self._step: tuple[list[str], list[torch.Tensor], list[torch.Tensor]] | None = None

    @property
    def importance(self) -> dict[str, torch.Tensor]:
        """Ω by parameter name."""
        return self.surrogate.importance

    @property
    def anchor(self) -> dict[str, torch.Tensor]:
        """θ̃ by parameter name."""
        return self.surrogate.anchor

    def before_experience(self, ctx, experience):
        self._omega, self._start, self._before, self._step = {}, {}, {}, None
        self.surrogate.before_experience(ctx, experience)

    def training_loss(self, ctx, x, y, logits, loss):
        if not self.importance or self.c == 0:
            return loss
        return loss + self.c * self.surrogate.penalty(ctx.model)

    @torch.no_grad()
    def before_optimizer_step(self, ctx, optimizer):
        """Record g (the unregularised gradient) and θ before the update."""
        pairs = [(n, p) for n, p in ctx.model.named_parameters() if p.requires_grad and p.grad is not None]
        if not pairs:
            self._step = None
            return
        names = [n for n, _ in pairs]
        params = [p for _, p in pairs]
        for n, p in pairs:
            if n not in self._omega:
                self._track(n, p)
        # the copy of p.grad also zeroes what a step AMP skips leaves non-finite
        grads = [torch.nan_to_num(p.grad.to(self._omega[n].dtype), nan=0.0, posinf=0.0, neginf=0.0)
                 for n, p in pairs]
        if self.importance and self.c != 0:
            self.surrogate._flat(ctx.model)  # Ω and θ̃ as views on the parameters' device
            held = [i for i, n in enumerate(names) if n in self.importance]
            if held:
                pulls = torch._foreach_sub([params[i].to(grads[i].dtype) for i in held],
                                           [self.anchor[names[i]].to(grads[i].dtype) for i in held])
                torch._foreach_mul_(pulls, [self.importance[names[i]].to(grads[i].dtype) for i in held])
                torch._foreach_add_([grads[i] for i in held], pulls, alpha=-2.0 * self.c)
        torch._foreach_copy_([self._before[n] for n in names], params)
        self._step = (names, params, grads)

    def _track(self, name: str, p: torch.Tensor) -> None:
        if name in self.importance and self.importance[name].shape != p.shape:
            raise UserError(f"SI holds an importance of shape {tuple(self.importance[name].shape)} for '{name}', "
                            f"which now has shape {tuple(p.shape)}", where="strategy",
                            fix="SI cannot follow parameters that change shape; combine it with a method that "
                                "adds new parameters instead of reshaping old ones")
        self._omega[name] = _accumulator(p)
        self._start[name] = p.detach().clone()
        self._before[name] = torch.empty_like(p)

    @torch.no_grad()
    def after_optimizer_step(self, ctx):
        """ω ← ω − g · Δθ for the step just taken."""
        if self._step is None:
            return
        names, params, grads = self._step
        self._step = None
        deltas = torch._foreach_sub(params, [self._before[n] for n in names])
        deltas = [d.to(g.dtype) for d, g in zip(deltas, grads)]
        torch._foreach_mul_(deltas, grads)
        torch._foreach_sub_([self._omega[n] for n in names], deltas)

    @torch.no_grad()
    def after_experience(self, ctx, experience):
        """Ω ← max(0, Ω + ω / (Δ² + ξ)) (Eq. 5), θ̃ ← θ; ω reset."""
        current = {n: p.detach() for n, p in ctx.model.named_parameters()}
        names = [n for n in current if n in self._omega or n in self.importance]
        increments, theta = {}, {}
        total = torch.zeros((), dtype=torch.float64)
        for n in names:
            p = current[n]
            old = self.importance.get(n)
            old = old.to(p.device) if old is not None else torch.zeros_like(_accumulator(p))
            if n in self._omega:
                omega = self._omega[n].to(p.device)
                change = (p - self._start[n].to(p.device)).to(omega.dtype)
                step = omega / (change.square() + self.xi)
                increments[n] = torch.maximum(step, -old)  # Ω + increment = max(0, Ω + step)
                total += omega.sum().double().cpu()
            else:  # not trained this time: Ω unchanged, θ̃ moves to where it is
                increments[n] = torch.zeros_like(old)
            theta[n] = p.clone()
        self.surrogate.consolidate(increments, theta)
        self.path_integral.append(float(total))
        self._omega, self._start, self._before = {}, {}, {}

    def diagnostics(self):
        return {"path_integral": list(self.path_integral)} if self.path_integral else {}

    def state_dict(self):
        return {**self.surrogate.state_dict(), "path_integral": list(self.path_integral)}

    def load_state_dict(self, state):
        self.surrogate.load_state_dict(state)
        self.path_integral = [float(v) for v in state.get("path_integral", [])]
