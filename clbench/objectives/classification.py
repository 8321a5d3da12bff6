"""Classification: cross-entropy on logits, accuracy as the R-matrix entry.

Optionally the training loss is a class-weighted cross-entropy (the thesis's
``weighted_cross_entropy``, ``alpha=auto``) with a cap on any one class's weight. The thesis
gives neither the formula nor the cap's value (seeds_004 section 7); the choices made here:

* ``alpha: auto`` is inverse class frequency normalised over the classes present,
  ``w_c = N / (K * n_c)``, with ``N`` the experience's training samples, ``n_c`` those of class
  ``c`` and ``K`` the number of classes present. The average *sample* weight is then 1, and an
  experience whose classes are equally frequent gets every weight 1: the unweighted loss.
* The cap (default :data:`DEFAULT_CAP` = 10) bounds every weight, so a class with a handful of
  samples cannot dominate the gradient; a class absent from the experience gets the cap (its
  inverse frequency is unbounded), which only matters for samples a strategy adds (replay).
* Weights come from the current experience's own training labels, recomputed when each
  experience starts (:meth:`Classification.begin_experience`), not from a replay buffer's
  samples joined to it: they describe the imbalance of the incoming data.
* An explicit ``alpha`` list (one weight per class) is used for every experience, capped too,
  so the cap is one guarantee on the largest weight whatever the source.

Only the training loss is weighted (and what strategies recompute from it, e.g. EWC's Fisher);
evaluation scores are the unweighted metrics.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor
from typing_extensions import TypedDict

from clbench.objectives.base import Objective
from clbench.config.validation import ArgumentError, mapping_argument

#: The default largest class weight (the thesis caps weights but does not say at what).
DEFAULT_CAP = 10.0


@mapping_argument
class ClassWeights(TypedDict, total=False):
    """``class_weights: {alpha: auto | [w_0, ...], cap: 10}``: inverse frequency or one positive
    weight per class, capped at ``cap`` (null: no cap)."""

    alpha: Literal["auto"] | Annotated[list[Annotated[float, Field(gt=0)]], Field(min_length=1)]
    cap: Annotated[float, Field(ge=1)] | None


def inverse_frequency(labels, num_classes: int, cap: float | None = DEFAULT_CAP) -> Tensor:
    """``w_c = N / (K * n_c)`` over the classes present, capped; absent classes get the cap
    (or, with no cap, the largest present weight)."""
    labels = torch.as_tensor(labels, dtype=torch.long).reshape(-1)
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"labels outside 0..{num_classes - 1}")
    counts = torch.bincount(labels, minlength=num_classes).double()
    present = counts > 0
    weights = torch.zeros(num_classes, dtype=torch.float64)
    if present.any():
        weights[present] = labels.numel() / (int(present.sum()) * counts[present])
    absent = cap if cap is not None else (float(weights.max()) if present.any() else 1.0)
    weights[~present] = absent
    if cap is not None:
        weights = weights.clamp(max=cap)
    return weights.float()


def _settings(class_weights: ClassWeights | Literal["auto"] | bool | None
              ) -> tuple[str | list[float], float | None] | None:
    """``(alpha, cap)`` from the ``class_weights`` argument (checked against its annotation)."""
    if class_weights is None or class_weights is False:
        return None
    if class_weights is True or class_weights == "auto":
        return "auto", DEFAULT_CAP
    alpha = class_weights.get("alpha", "auto")
    cap = class_weights.get("cap", DEFAULT_CAP)
    if alpha != "auto":
        alpha = [float(a) for a in alpha]
    return alpha, None if cap is None else float(cap)


class Classification(Objective):
    """Logits ``(N, K)`` against integer labels ``(N,)``.

    Every test column is scored by micro accuracy (``acc``, the R entry), and by G-mean and
    MAUC when the stream opts in (``StreamSpec.imbalance_metrics``, as the built-in image
    streams do) or the config says ``objective: {class_path: classification, init_args:
    {imbalance: true}}`` (``false`` turns them off for any stream).

    ``class_weights: {alpha: auto | [w_0, ...], cap: 10}`` (or just ``auto``) weights the
    training cross-entropy per class; see the module docstring for the formula and the cap.

    On a task-incremental stream (``scenario_type: task-il``) whose experiences hold disjoint
    classes, the task identity is given: a sample's logits are restricted to the classes of its
    task (the others set to the dtype's lowest value) in the training loss and at test, which is
    a multi-headed output on one shared head. The task is read from the label, which names it
    because the class sets are disjoint; streams whose tasks reuse labels (every task's classes
    numbered from 0) are left unmasked, their labels already being per task.
    """

    model_args: ClassVar[tuple[str, ...]] = ("num_classes", "input_shape")
    provides: ClassVar[frozenset[str]] = frozenset({"classification"})

    def __init__(self, imbalance: bool | None = None,
                 class_weights: ClassWeights | Literal["auto"] | bool | None = None):
        """``imbalance``: G-mean and MAUC on every column; ``None`` follows the stream.
        ``class_weights``: weighted cross-entropy for training (``None``: unweighted)."""
        self.imbalance = imbalance
        self.weighting = _settings(class_weights)
        self.weight: Tensor | None = None  # the current experience's class weights
        self.task_mask: Tensor | None = None  # (K, K) bool: the classes of class c's task (task-il)

    def setup(self, spec, experiences) -> None:
        super().setup(spec, experiences)
        self.num_classes = spec.num_classes
        if self.imbalance is None:
            self.imbalance = spec.imbalance_metrics
        self.task_mask = task_mask(spec, experiences)
        if self.weighting is not None:
            alpha = self.weighting[0]
            if not self.num_classes:
                raise ArgumentError("objective", "class_weights", "class weights need the stream's number of classes",
                                    fix="remove class_weights for this stream")
            if alpha != "auto" and len(alpha) != self.num_classes:
                raise ArgumentError("objective", "class_weights.alpha", f"alpha lists {len(alpha)} weights for "
                                    f"{self.num_classes} classes",
                                    fix=f"give {self.num_classes} weights, or alpha: auto")

    def model_kwargs(self, spec) -> dict[str, Any]:
        return {"num_classes": spec.num_classes, "input_shape": tuple(spec.input_shape)}

    # -- class weights --------------------------------------------------------------------
    def weights_for(self, dataset) -> Tensor | None:
        """The class weights training on ``dataset`` uses (``None``: unweighted)."""
        if self.weighting is None:
            return None
        alpha, cap = self.weighting
        if alpha != "auto":
            weights = torch.tensor(alpha, dtype=torch.float32)
            return weights.clamp(max=cap) if cap is not None else weights
        from clbench.data.datasets import targets_of

        try:
            return inverse_frequency(targets_of(dataset), self.num_classes, cap)
        except ValueError as err:
            raise ArgumentError("objective", "class_weights", f"cannot weight classes: {err}",
                                fix="check the stream's labels against its num_classes") from None

    def begin_experience(self, experience) -> None:
        """Before an experience (or the pretraining set) trains: its class weights."""
        self.weight = self.weights_for(experience.train)

    def summary(self) -> dict[str, Any]:
        if self.weighting is None:
            return {}
        alpha, cap = self.weighting
        per = [[round(float(w), 6) for w in self.weights_for(exp.train)] for exp in self.experiences]
        return {"class_weights": {"alpha": alpha, "cap": cap, "per_experience": per}}

    # -- training and evaluation ----------------------------------------------------------
    def restrict(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """``outputs`` with the logits outside each sample's task masked (task-il; else unchanged)."""
        if self.task_mask is None:
            return outputs
        keep = self.task_mask.to(outputs.device)[targets]
        return outputs.masked_fill(~keep, torch.finfo(outputs.dtype).min)

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        outputs = self.restrict(outputs, targets)
        if self.weight is None:
            return F.cross_entropy(outputs, targets)
        return F.cross_entropy(outputs, targets, weight=self.weight.to(device=outputs.device, dtype=outputs.dtype))

    def metrics(self, experience):
        from clbench.metrics.collection import make_eval_metrics

        return make_eval_metrics(self.num_classes, imbalance=bool(self.imbalance))

    def metric_specs(self):
        from clbench.metrics.collection import CLASSIFICATION_METRICS

        return CLASSIFICATION_METRICS

    @torch.no_grad()
    def evaluate(self, model, batch, metrics, column=None) -> None:
        super().evaluate(model, batch, metrics if self.task_mask is None else _Restricted(metrics, self), column)


class _Restricted:
    """A column's metrics fed task-restricted logits (:meth:`Classification.restrict`)."""

    def __init__(self, metrics, objective: Classification):
        self.metrics, self.objective = metrics, objective

    def update(self, outputs: Tensor, targets: Tensor) -> None:
        self.metrics.update(self.objective.restrict(outputs, targets), targets)


def task_mask(spec, experiences) -> Tensor | None:
    """(K, K) bool, row c the classes of the experience holding class c, for a task-il stream
    whose experiences hold disjoint classes; None otherwise (see :class:`Classification`)."""
    if spec.scenario_type != "task-il" or not spec.num_classes:
        return None
    groups = [sorted(exp.classes) for exp in experiences]
    flat = [c for g in groups for c in g]
    if len(flat) != len(set(flat)):
        return None
    mask = torch.zeros(spec.num_classes, spec.num_classes, dtype=torch.bool)
    for group in groups:
        idx = torch.tensor(group, dtype=torch.long)
        mask[idx.unsqueeze(1), idx] = True
    return mask
