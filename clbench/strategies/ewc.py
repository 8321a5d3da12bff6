"""Elastic Weight Consolidation (EWC) and its online variant.

Kirkpatrick et al. 2017, "Overcoming catastrophic forgetting in neural networks" (PNAS);
online EWC: Schwarz et al. 2018, "Progress & Compress" (ICML). After each experience the
diagonal Fisher information F at the trained parameters θ* is estimated, and later training
minimises ``loss + λ/2 · Σ_i F_i (θ_i − θ*_i)²``.

* ``separate`` (Kirkpatrick): one penalty per past experience t with its own (F_t, θ*_t). The
  sum of those quadratics is itself one quadratic, ``Σ_t F_t (θ − θ*_t)² = A (θ − μ)² + c``
  with ``A = Σ_t F_t``, ``μ = Σ_t F_t θ*_t / A`` and ``c = Σ_t F_t (θ*_t − μ)²``; the strategy
  keeps (A, μ, c), updated exactly at each experience, so a training step costs the same for
  any number of past experiences and memory stays at two copies of the parameters.
* ``online`` (Schwarz): ``F* ← γ F* + F_t`` and the anchor is the latest θ*. Writing the
  penalty with ``γ F*`` instead (as some statements of online EWC do) only rescales λ by γ.

Fisher: the diagonal *empirical* Fisher, the mean over ``fisher_samples`` training samples of
the squared per-sample gradient of the log-likelihood at the observed label,
``(∂ log p(y_n | x_n; θ*) / ∂θ)²``. A model whose trainable parameters are all in linear
layers applied to vectors (an MLP) gets it from one backward pass per chunk of
``fisher_batch_size`` samples, as ``(δ²)ᵀ a²`` per layer (:func:`linear_gradient_moments`);
any other model from ``torch.func`` (vmap over per-sample grads, in chunks); keyword (dict)
inputs, a transformers model's, take one backward pass per sample, since vmap cannot trace
their data-dependent masking. The
paper defines F as the Fisher of the model's own predictive distribution (the "true" Fisher,
expectation over y ~ p(y | x; θ*)); the empirical one needs no sampling or sum over classes and
is deterministic, at the cost of being a coarser curvature estimate away from a well-fit
optimum (van de Ven 2025, "On the Computation of the Fisher Information in Continual
Learning", compares the variants). The model is put in eval mode while the Fisher is estimated
(dropout off, batch norm on its running statistics), so the estimate is deterministic and
per-sample gradients are well defined.
"""

from __future__ import annotations

from typing import Annotated, Callable, Literal

import torch
from pydantic import Field
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.utils._pytree import tree_leaves, tree_map

from clbench import Objective, Strategy
from clbench.data.datasets import make_loader, subset
from clbench.errors import UserError
from clbench.strategies.replay import seeded_generator

_CHUNK_BUDGET = 2**28  # per-sample gradient numbers held at once when the chunk size is automatic


class _Functional:
    """``model`` called with substitute parameters (what ``torch.func`` differentiates)."""

    def __init__(self, model: nn.Module, tensors: tuple[dict, ...]):
        self.model, self.tensors = model, tensors

    def __call__(self, *args, **kwargs):
        return functional_call(self.model, self.tensors, args, kwargs)


def diagonal_fisher(model: nn.Module, dataset, *, batch_size: int = 64, device: torch.device | None = None,
                    objective: Objective | None = None) -> dict[str, torch.Tensor]:
    """Mean squared per-sample gradient of the log-likelihood for every trainable parameter.

    The log-likelihood is the objective's task loss of one sample (cross-entropy for
    classification, the default).
    """
    if objective is None:
        from clbench.objectives.classification import Classification

        objective = Classification()
    device = device or next(model.parameters()).device
    trainable = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach() for n, p in model.named_parameters() if not p.requires_grad}
    buffers = {n: b.detach() for n, b in model.named_buffers()}

    def nll(params, x, y):
        one = tree_map(lambda t: t.unsqueeze(0), (x, y))
        return objective.loss_of(_Functional(model, (params, frozen, buffers)), *one)

    per_sample = vmap(grad(nll), in_dims=(None, 0, 0))
    fisher = {n: torch.zeros_like(p) for n, p in trainable.items()}
    count = 0
    was_training = model.training
    model.eval()
    try:
        for batch in make_loader(dataset, batch_size, shuffle=False, collate_fn=objective.collate(train=True)):
            x, y = tree_map(lambda t: t.to(device), objective.split(batch))
            if isinstance(x, dict):
                _accumulate_one_by_one(model, objective, x, y, fisher)
            elif not (type(objective).loss_of is Objective.loss_of and linear_gradient_moments(
                    model, objective.forward, per_sample_losses(objective), trainable, x, y, fisher, power=2)):
                for n, g in per_sample(trainable, x, y).items():
                    fisher[n] += g.pow(2).sum(0)
            count += len(tree_leaves(y)[0])
    finally:
        model.train(was_training)
    return {n: f / max(count, 1) for n, f in fisher.items()}


def per_sample_losses(objective: Objective) -> Callable:
    """``(outputs, targets) -> (B,)``: each sample's task loss, the objective's loss on a batch of one."""
    return vmap(lambda o, t: objective.loss(o.unsqueeze(0), t.unsqueeze(0)))


def linear_gradient_moments(model: nn.Module, forward: Callable, sample_losses: Callable, trainable: dict, x,
                            targets, out: dict, power: int) -> bool:
    """Add Σ_n |g_n|^power, the per-sample gradients' ``power``-th moments (2: squares, EWC's
    Fisher; 1: absolute values, MAS's importance), to ``out``, without materialising g_n, where
    every trainable parameter is a weight or bias of an ``nn.Linear`` called once on a batch of
    vectors; False (``out`` untouched) where not, so the caller computes them one sample at a time.
    g_n is the gradient of ``sample_losses(forward(model, x), targets)[n]``.

    Sample n's gradient for such a layer is an outer product, ``δ_n a_nᵀ`` (δ_n: the gradient of
    its loss at the layer's output, a_n: its input), so ``Σ_n |δ_n a_nᵀ|^p = (|δ|^p)ᵀ |a|^p``,
    one matrix product for the whole batch instead of B gradient-sized tensors (for the 2x400
    MLP, 256 x 478k numbers per chunk): the same sums, rounded in another order. One backward
    of the summed per-sample losses gives every δ_n, since in eval mode samples do not interact.
    """
    if not isinstance(x, torch.Tensor):
        return False
    owners: dict[nn.Module, dict[str, str]] = {}  # layer -> {"weight"/"bias": its name in ``trainable``}
    for prefix, module in model.named_modules():
        for kind, param in module.named_parameters(recurse=False):
            name = f"{prefix}.{kind}" if prefix else kind
            if name in trainable:
                if not isinstance(module, nn.Linear):
                    return False
                owners.setdefault(module, {})[kind] = name
    if sum(len(kinds) for kinds in owners.values()) != len(trainable):
        return False  # a trainable tensor that no module owns directly (tied or shared)
    seen: dict[nn.Module, tuple | None] = {}

    def keep(module, inputs, output):
        seen[module] = None if module in seen else (inputs[0], output)  # a second call: not a single outer product

    handles = [module.register_forward_hook(keep) for module in owners]
    try:
        with torch.enable_grad():
            outputs = forward(model, x)
            layers = list(owners)
            if any(seen.get(m) is None or seen[m][0].ndim != 2 or not seen[m][1].requires_grad for m in layers):
                return False
            losses = sample_losses(outputs, targets)
    finally:
        for handle in handles:
            handle.remove()
    deltas = torch.autograd.grad(losses.sum(), [seen[m][1] for m in layers])
    for module, delta in zip(layers, deltas):
        d, a = delta.detach().abs().pow(power), seen[module][0].detach().abs().pow(power)
        if "weight" in owners[module]:
            out[owners[module]["weight"]] += d.T @ a
        if "bias" in owners[module]:
            out[owners[module]["bias"]] += d.sum(0)
    return True


def _accumulate_one_by_one(model: nn.Module, objective: Objective, x: dict, y, fisher: dict) -> None:
    """Add each sample's squared gradient to ``fisher``, one backward pass per sample.

    For keyword (dict) inputs, the form of transformers models: their forward builds attention
    masks with data-dependent branches, which ``vmap`` cannot trace. A sample keeps its batch's
    padding, which its attention mask and ignored labels leave out of its loss.
    """
    names = list(fisher)
    params = dict(model.named_parameters())
    params = [params[n] for n in names]
    for i in range(len(tree_leaves(y)[0])):
        xi, yi = tree_map(lambda t, i=i: t[i:i + 1], (x, y))
        with torch.enable_grad():
            loss = objective.loss_of(model, xi, yi)
        for n, g in zip(names, torch.autograd.grad(loss, params, allow_unused=True)):
            if g is not None:
                fisher[n] += g.pow(2)


def estimation_set(experience, samples: int | None, seed: int, purpose: str):
    """The training samples an importance is estimated on: all, or a seeded subset of ``samples``."""
    dataset = experience.train
    if samples is None or samples >= len(dataset):
        return dataset
    generator = seeded_generator(seed, purpose, experience.position)
    return subset(dataset, torch.randperm(len(dataset), generator=generator)[:samples].tolist())


def estimation_chunk(model: nn.Module, chunk: int | None) -> int:
    """Samples per chunk: ``chunk``, or the largest up to 256 whose per-sample gradients hold at
    most :data:`_CHUNK_BUDGET` numbers."""
    if chunk is not None:
        return chunk
    numbers = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return max(1, min(256, _CHUNK_BUDGET // max(numbers, 1)))


class EWC(Strategy):
    """Elastic Weight Consolidation.

    Args:
        ewc_lambda: λ, the penalty strength. The paper tunes it per problem and gives no
            general default; 100 suits the digits streams with the default MLP and Adam.
        mode: ``separate`` (one penalty per past experience, the paper) or ``online``.
        gamma: γ, the decay of the accumulated Fisher in ``online`` mode. Default 1.0 (no
            decay: the recursion that follows from Bayes' rule); Progress & Compress uses
            γ < 1 to let old experiences fade.
        fisher_samples: training samples of each experience the Fisher is estimated on
            (a seeded random subset); ``None`` uses all of them, as the paper does.
        fisher_batch_size: samples per vmapped chunk; it changes memory use, not F. ``None``
            takes the largest chunk (up to 256) whose per-sample gradients hold at most 2^28
            numbers (1 GiB in float32), so a large model gets small chunks.
    """

    supports_distributed = True  # DDP: every rank estimates the same Fisher on the same samples

    def __init__(self, ewc_lambda: Annotated[float, Field(ge=0)] = 100.0,
                 mode: Literal["separate", "online"] = "separate", gamma: Annotated[float, Field(ge=0, le=1)] = 1.0,
                 fisher_samples: Annotated[int, Field(ge=1)] | None = None,
                 fisher_batch_size: Annotated[int, Field(ge=1)] | None = None):
        super().__init__()
        self.ewc_lambda = ewc_lambda
        self.mode = mode
        self.gamma = gamma
        self.fisher_samples = fisher_samples
        self.fisher_batch_size = fisher_batch_size
        self.importance: dict[str, torch.Tensor] = {}  # A (separate) or F* (online)
        self.anchor: dict[str, torch.Tensor] = {}      # μ (separate) or the latest θ* (online)
        self.offset = 0.0                              # c: the penalty's value at θ = μ
        self.consolidated = 0                          # experiences folded in so far
        self._terms: tuple[list[torch.Tensor], torch.Tensor, torch.Tensor] | None = None  # see _flat
        self.method = "EWC"  # how errors name the method (SI and MAS keep their penalty in an EWC)

    def before_experience(self, ctx, experience):
        self._terms = None

    def penalty(self, model: nn.Module) -> torch.Tensor:
        """``Σ_t Σ_i F_t,i (θ_i − θ*_t,i)²`` (without λ/2) for the current parameters.

        One flat dot product over all parameters: a handful of kernels per step whatever the
        number of parameter tensors, instead of several per tensor.
        """
        params, importance, anchor = self._flat(model)
        if not params:
            return torch.zeros(()) + self.offset
        theta = torch.cat([p.reshape(-1) for p in params])
        return torch.dot(importance, (theta - anchor).square()) + self.offset

    def _flat(self, model: nn.Module):
        """(parameters, A, μ) with A and μ flattened in parameter order on the parameters' device.

        Built once per experience (or device move); the per-name dicts become views of the flat
        tensors, so the device holds one copy of the state.
        """
        cache = self._terms
        if cache is not None and (not cache[0] or cache[1].device == cache[0][0].device):
            return cache
        named = [(n, p) for n, p in model.named_parameters() if n in self.importance]
        for n, p in named:
            if self.importance[n].shape != p.shape:
                raise UserError(f"{self.method} holds an importance of shape {tuple(self.importance[n].shape)} for "
                                f"'{n}', which now has shape {tuple(p.shape)}", where="strategy",
                                fix=f"{self.method} cannot follow parameters that change shape; combine it with a "
                                    "method that adds new parameters instead of reshaping old ones")
        params = [p for _, p in named]
        if not params:
            self._terms = ([], torch.zeros(0), torch.zeros(0))
            return self._terms
        like = dict(device=params[0].device, dtype=params[0].dtype)
        importance = torch.cat([self.importance[n].reshape(-1).to(**like) for n, _ in named])
        anchor = torch.cat([self.anchor[n].reshape(-1).to(**like) for n, _ in named])
        start = 0
        for n, p in named:
            end = start + p.numel()
            self.importance[n], self.anchor[n] = importance[start:end].view_as(p), anchor[start:end].view_as(p)
            start = end
        self._terms = (params, importance, anchor)
        return self._terms

    def training_loss(self, ctx, x, y, logits, loss):
        if not self.importance or self.ewc_lambda == 0:
            return loss
        return loss + 0.5 * self.ewc_lambda * self.penalty(ctx.model)

    def after_experience(self, ctx, experience):
        dataset = estimation_set(experience, self.fisher_samples, self.seed, "ewc-fisher")
        model = ctx.model
        chunk = estimation_chunk(model, self.fisher_batch_size)
        home = next(model.parameters()).device
        device = ctx.device  # where training runs (a module outside a run is back on the CPU after fit)
        model.to(device)
        try:
            fisher = diagonal_fisher(model, dataset, batch_size=chunk, device=device, objective=ctx.objective)
            theta = {n: p.detach().clone() for n, p in model.named_parameters() if n in fisher}
        finally:
            model.to(home)
        self.consolidate(fisher, theta)

    def consolidate(self, fisher: dict[str, torch.Tensor], theta: dict[str, torch.Tensor]) -> None:
        """Fold one experience's Fisher and trained parameters into the penalty."""
        if self.mode == "online":
            for n, f in fisher.items():
                old = self.importance.get(n)
                self.importance[n] = f.clone() if old is None else self.gamma * old.to(f.device) + f
                self.anchor[n] = theta[n].clone()
            self.offset = 0.0
        else:
            offset = torch.zeros((), dtype=torch.float64)
            for n, f in fisher.items():
                a_old = self.importance.get(n)
                if a_old is None:
                    self.importance[n], self.anchor[n] = f.clone(), theta[n].clone()
                    continue
                a_old, mu_old = a_old.to(f.device), self.anchor[n].to(f.device)
                a_new = a_old + f
                safe = torch.where(a_new > 0, a_new, torch.ones_like(a_new))
                mu_new = torch.where(a_new > 0, (a_old * mu_old + f * theta[n]) / safe, theta[n])
                offset += (a_old * (mu_old - mu_new).pow(2) + f * (theta[n] - mu_new).pow(2)).sum().double().cpu()
                self.importance[n], self.anchor[n] = a_new, mu_new
            self.offset += float(offset)
        self.consolidated += 1
        self._terms = None

    def state_dict(self):
        return {"importance": {n: t.detach().cpu().clone() for n, t in self.importance.items()},
                "anchor": {n: t.detach().cpu().clone() for n, t in self.anchor.items()},
                "offset": self.offset, "consolidated": self.consolidated}

    def load_state_dict(self, state):
        self.importance = dict(state["importance"])
        self.anchor = dict(state["anchor"])
        self.offset = float(state["offset"])
        self.consolidated = int(state["consolidated"])
        self._terms = None
