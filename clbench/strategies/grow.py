"""Grow, Don't Overwrite: function-preserving MLP expansion (G-Freeze and G-Train).

Adila, Mazzawi, Dherin, Gonzalvo, "Grow, Don't Overwrite: Fine-tuning Without Forgetting".
Before training on a new task, the MLP of each selected layer is widened from p to k·p hidden
units by copying its up-projection k times and stacking its down-projection k times scaled by
1/k (clbench/models/layers/grow.py), so the grown model computes exactly the function it had. Then
only part of the model trains:

* ``freeze`` (G-Freeze, the paper's default): only the new copies, the up/gate rows and the
  down columns of hidden units p..k·p; everything else, the original block of every grown
  matrix included, stays as it was.
* ``train`` (G-Train, the paper's variant for reasoning tasks): the whole grown up (and gate)
  projection trains; the down projection and everything else stay frozen.

In a stream the first experience trains the model as configured (it plays the pretrained
model M_0); growth happens once, before the second experience (``when: once``, the default: the
paper grows a pretrained model once, before fine-tuning it), or before each later experience
(``when: each``). With ``each``, the model as it is at that point is grown, so the
frozen part is everything trained so far and grown widths go p, k·p, k²·p, …: the paper's
equation applied to the current model. Parameter counts before and after every growth are kept
(``hparams()["growth"]``), the paper's cost axis.

Choices where the paper is silent (see docs/strategies.md):

* Gated MLPs (Gemma, Qwen3, LLaMA): the paper writes a ReLU MLP; the gate is treated as a second
  up projection, copied like it and trained like it in both variants.
* Biases: up/gate biases are copied; in G-Freeze the copies' entries train and the originals do
  not; the down bias is original and frozen in both variants.
* Freezing within one matrix uses gradient masks, not a split into a frozen and a trainable
  module: the grown layers stay plain ``nn.Linear`` (state-dict keys unchanged, a grown model
  loads into a plain model of width k·p, other tools see ordinary layers). Masked gradients
  keep the optimizer's moments at zero for frozen entries, but weight decay (AdamW's decoupled
  decay, SGD's L2 term) and any optimizer that moves a weight with zero gradient would still
  change them; so the frozen slices are also written back after every optimizer step, which
  keeps them bit for bit. The price is optimizer state for the frozen half of grown matrices.
* Layer choice (``top_n``): "rank layers by the magnitude of their weight updates" after "a
  preliminary standard fine-tuning run". Here: ``probe_steps`` steps of full fine-tuning of a
  copy of the model on the new experience with the run's optimizer; a layer's magnitude is the
  norm (``probe_norm``) of the update of its MLP weights (up, gate and down, as one vector),
  optionally relative to their norm before. Only MLP weights are measured since the MLP is what
  grows, and this works for models with no notion of "block". The probe's time is recorded.
* Data parallelism: each rank runs the same seeded probe on the whole experience (it is not
  sharded), and rank 0's scores are broadcast, so every rank widens the same layers the same
  way, as one process would; the widened model is then replicated like any other.
"""

from __future__ import annotations

import copy
import time
from typing import Annotated, Any, Literal

import torch
from pydantic import Field
from torch import nn
from torch.utils._pytree import tree_map

from clbench import ArgumentError, Strategy, derive_seed
from clbench.data.datasets import make_loader
from clbench.errors import UserError
from clbench.models.layers.grow import MLP, find_mlps, grow_mlp

def shared(scores: dict[str, float]) -> dict[str, float]:
    """Rank 0's probe scores on every rank (under data parallelism), so that all ranks grow the
    same layers even where non-deterministic kernels make their probes differ in the last bits."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [scores]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return scores


class Grow(Strategy):
    """Grow, Don't Overwrite.

    Args:
        k: the expansion factor (hidden width p -> k·p). The paper uses 2 throughout.
        variant: ``freeze`` (G-Freeze, only new copies train) or ``train`` (G-Train, whole up
            projections train, down projections frozen).
        when: ``once`` (before the second experience only, as the paper grows once; later
            experiences keep training the same new copies) or ``each`` (before every experience
            after the first; widths compound, p, k·p, k²·p, ...).
        layers: ``all`` or a list of MLPs, each an index into the model's MLPs in module order
            or an MLP name (``blocks.3.mlp``); with ``top_n``, the candidates ranked.
        top_n: grow the N candidates whose weights moved most in a preliminary run (0: off).
        probe_steps: optimizer steps of the preliminary run.
        probe_batch_size: its batch size.
        probe_norm: ``fro`` (Euclidean), ``l1`` or ``max`` norm of a layer's weight update.
        probe_relative: divide the update's norm by the weights' norm before the run.
        also_train: parameter-name prefixes that train in full after growth (e.g. a new
            classifier head in a class-incremental stream); the paper trains nothing else.
    """

    supports_distributed = True  # every rank probes the same data; rank 0's scores decide for all
    supports_sharded = False  # copies and masks whole weight matrices

    def __init__(self, k: Annotated[int, Field(ge=2)] = 2, variant: Literal["freeze", "train"] = "freeze",
                 when: Literal["each", "once"] = "once",
                 layers: Literal["all"] | Annotated[list[int | str], Field(min_length=1)] = "all",
                 top_n: Annotated[int, Field(ge=0)] = 0, probe_steps: Annotated[int, Field(ge=1)] = 20,
                 probe_batch_size: Annotated[int, Field(ge=1)] = 32,
                 probe_norm: Literal["fro", "l1", "max"] = "fro", probe_relative: bool = False,
                 also_train: list | None = None):
        super().__init__()
        self.k, self.variant, self.when = k, variant, when
        self.layers, self.top_n = layers, top_n
        self.probe_steps, self.probe_batch_size = probe_steps, probe_batch_size
        self.probe_norm, self.probe_relative = probe_norm, probe_relative
        self.also_train = list(also_train or [])
        self.growths: list[dict[str, Any]] = []  # one record per growth, in order
        self._grown = 0  # how many of them this process's model has
        self._masked: list[tuple[torch.Tensor, int, int]] = []  # (parameter, dim, frozen length)
        self._saved: list[torch.Tensor] = []  # the frozen slices' values

    def diagnostics(self) -> dict[str, Any]:
        return {"growth": [{k: v for k, v in g.items() if k != "scores"} for g in self.growths],
                "probe_seconds": sum(g["probe_seconds"] for g in self.growths)}

    # -- choosing --------------------------------------------------------------------------
    def setup(self, ctx, experiences, seed):
        super().setup(ctx, experiences, seed)
        self.candidates(ctx.model)  # refuse a model without MLPs or a bad list before training

    def candidates(self, model: nn.Module) -> list[MLP]:
        mlps = find_mlps(model)
        if not mlps:
            raise UserError(f"{type(model).__name__} has no MLP the grow strategy can widen", where="strategy",
                            fix="use a model with gate/up/down projections, timm Mlp blocks (fc1/fc2) or "
                                "Linear-activation-Linear in an nn.Sequential")
        if self.layers == "all":
            return mlps
        names = {m.name: m for m in mlps}
        chosen = []
        for entry in self.layers:
            if isinstance(entry, int) and -len(mlps) <= entry < len(mlps):
                chosen.append(mlps[entry])
            elif isinstance(entry, str) and entry in names:
                chosen.append(names[entry])
            else:
                raise ArgumentError("strategy", "layers", f"layers names {entry!r}, which is not one of the model's "
                                    f"{len(mlps)} MLPs", fix=f"use indices 0..{len(mlps) - 1} or names: "
                                                            + ", ".join(list(names)[:8]))
        return list(dict.fromkeys(chosen))

    def update_magnitudes(self, ctx, experience, mlps: list[MLP]) -> dict[str, float]:
        """Per MLP, the norm of its weights' update after a short full fine-tuning of a copy."""
        device = ctx.device
        model = copy.deepcopy(ctx.model).to(device).train()
        for p in model.parameters():
            p.requires_grad_(True)
        before = {q: model.get_submodule(q).weight.detach().clone() for m in mlps for q in m.linears}
        optimizer = ctx.make_optimizer(list(model.parameters()))
        objective = ctx.objective
        loader = make_loader(experience.train, self.probe_batch_size, shuffle=True,
                             seed=derive_seed(self.seed, "grow-probe", experience.position),
                             collate_fn=objective.collate(train=True))
        steps = 0
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):  # the run's own random stream is left as it was
            while steps < self.probe_steps:
                for batch in loader:
                    x, y = tree_map(lambda t: t.to(device) if torch.is_tensor(t) else t, objective.split(batch))
                    optimizer.zero_grad(set_to_none=True)
                    objective.loss_of(model, x, y).backward()
                    optimizer.step()
                    steps += 1
                    if steps == self.probe_steps:
                        break
        order = {"fro": 2, "l1": 1, "max": float("inf")}[self.probe_norm]
        scores = {}
        for m in mlps:
            delta = torch.cat([(model.get_submodule(q).weight.detach() - before[q]).flatten() for q in m.linears])
            value = torch.linalg.vector_norm(delta.float(), ord=order)
            if self.probe_relative:
                value = value / torch.linalg.vector_norm(torch.cat([before[q].flatten() for q in m.linears]).float(),
                                                         ord=order).clamp_min(1e-12)
            scores[m.name] = float(value)
        return scores

    # -- growing ---------------------------------------------------------------------------
    def adapt_model(self, ctx, upto):
        """Replay the growths recorded but not yet made on this model (a resume), then grow if
        experience ``upto - 1`` is due a growth that is not recorded yet."""
        model = ctx.model
        while self._grown < len(self.growths):
            self.regrow(model, self.growths[self._grown])
        if upto < 1 or upto > len(self.experiences):
            return  # before training, or asked for the whole stream's structure (not grown ahead)
        experience = self.experiences[upto - 1]
        due = experience.position >= 1 and (self.when == "each" or not self.growths)
        if due and not any(g["experience"] == experience.position for g in self.growths):
            self.grow(ctx, experience)

    def before_experience(self, ctx, experience):
        if self.growths:
            self._snapshot(ctx.model)

    def grow(self, ctx, experience) -> dict[str, Any]:
        """Choose the MLPs, widen them, set what trains; returns the growth's record."""
        model = ctx.model
        mlps = self.candidates(model)
        scores, seconds = {}, 0.0
        if self.top_n:
            start = time.perf_counter()
            scores = shared(self.update_magnitudes(ctx, experience, mlps))
            seconds = time.perf_counter() - start
            keep = set(sorted(scores, key=lambda name: -scores[name])[: self.top_n])
            mlps = [m for m in mlps if m.name in keep]
        params_before = sum(p.numel() for p in model.parameters())
        widths = [grow_mlp(model, m, self.k) for m in mlps]
        record = {"experience": experience.position, "k": self.k, "layers": [m.name for m in mlps],
                  "widths": widths, "params_before": params_before,
                  "params_after": sum(p.numel() for p in model.parameters()),
                  "probe_seconds": seconds, "scores": scores}
        self._set_trainable(model, record)
        record["params_trainable"] = self.trainable_count(model)
        self.growths.append(record)
        self._grown += 1
        return record

    def regrow(self, model: nn.Module, record: dict[str, Any]) -> None:
        """Widen ``model`` as a recorded growth did (the weights load afterwards) and set what
        trains as it did."""
        mlps = {m.name: m for m in find_mlps(model)}
        for name, width in zip(record["layers"], record["widths"]):
            if name not in mlps or mlps[name].width(model) != width:
                raise UserError(f"cannot re-grow MLP {name!r} of width {width} on the rebuilt model",
                                where="--resume", fix="resume with the model the run started with")
            grow_mlp(model, mlps[name], record["k"])
        self._set_trainable(model, record)
        self._grown += 1

    def _set_trainable(self, model: nn.Module, record: dict[str, Any]) -> None:
        """Freeze everything, then open the slices the variant trains for this growth's MLPs."""
        for p in model.parameters():
            p.requires_grad_(False)
        mlps = {m.name: m for m in find_mlps(model)}
        self._masked = []
        for name, p in zip(record["layers"], record["widths"]):
            mlp = mlps[name]
            for q in mlp.ups:
                up = model.get_submodule(q)
                for param in (up.weight, up.bias):
                    if param is not None:
                        param.requires_grad_(True)
                        if self.variant == "freeze":  # hidden units 0..p are the original ones
                            self._masked.append((param, 0, p))
            if self.variant == "freeze":
                down = model.get_submodule(mlp.down)
                down.weight.requires_grad_(True)
                self._masked.append((down.weight, 1, p))
        for name, param in model.named_parameters():
            if any(name.startswith(prefix) for prefix in self.also_train):
                param.requires_grad_(True)
        self._saved = []

    def trainable_count(self, model: nn.Module) -> int:
        """Entries that can change: trainable parameters less their frozen slices."""
        total = sum(p.numel() for p in model.parameters() if p.requires_grad)
        return total - sum(p.narrow(dim, 0, n).numel() for p, dim, n in self._masked)

    def _snapshot(self, model: nn.Module) -> None:
        self._saved = [p.detach().narrow(dim, 0, n).clone() for p, dim, n in self._masked]

    # -- per step --------------------------------------------------------------------------
    def after_backward(self, ctx):
        for p, dim, n in self._masked:
            if p.grad is not None:
                p.grad.narrow(dim, 0, n).zero_()

    @torch.no_grad()
    def after_optimizer_step(self, ctx):
        for i, (p, dim, n) in enumerate(self._masked):
            if self._saved[i].device != p.device:  # Lightning moved the model after the snapshot
                self._saved[i] = self._saved[i].to(p.device)
            p.narrow(dim, 0, n).copy_(self._saved[i])

    # -- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"growths": copy.deepcopy(self.growths)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.growths = copy.deepcopy(state["growths"])
