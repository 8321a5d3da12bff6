"""The evaluation metrics the harness computes on every test experience of a classification stream.

:data:`CLASSIFICATION_METRICS` declares them (:func:`clbench.metrics.declared.declare`): the one
place where torchmetrics' stock ``MulticlassAccuracy`` gets its title; G-mean and MAUC say what
they are on their own classes.
"""

from __future__ import annotations

from types import SimpleNamespace

from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from clbench.metrics.declared import MetricSpec, declare
from clbench.metrics.gmean import GeometricMean
from clbench.metrics.mauc import MulticlassMAUC

CLASSIFICATION_METRICS: dict[str, MetricSpec] = {spec.name: spec for spec in (
    declare("acc", MulticlassAccuracy, lambda objective: MulticlassAccuracy(objective.num_classes, average="micro"),
            title="ACC"),
    declare("gmean", GeometricMean, lambda objective: GeometricMean(objective.num_classes)),
    declare("mauc", MulticlassMAUC, lambda objective: MulticlassMAUC(objective.num_classes, input="logits")),
)}


def make_eval_metrics(num_classes: int, *, imbalance: bool = False) -> MetricCollection:
    """``acc`` (overall accuracy), plus ``gmean`` and ``mauc`` when ``imbalance`` is set.

    Each entry takes ``update(logits (N, K), targets (N,))``. MAUC keeps every probability
    vector until ``compute`` (N x K floats per test experience), which is why it is opt-in for
    the class-imbalance streams that the thesis scores with it.
    """
    names = ("acc", "gmean", "mauc") if imbalance else ("acc",)
    sized = SimpleNamespace(num_classes=num_classes)  # what the declarations' make() reads of an objective
    return MetricCollection({name: CLASSIFICATION_METRICS[name].make(sized) for name in names})
