"""The evaluation metrics the harness computes on every test experience."""

from __future__ import annotations

from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from clbench.metrics.gmean import GeometricMean
from clbench.metrics.mauc import MulticlassMAUC


def make_eval_metrics(num_classes: int, *, imbalance: bool = False) -> MetricCollection:
    """``acc`` (overall accuracy), plus ``gmean`` and ``mauc`` when ``imbalance`` is set.

    Each entry takes ``update(logits (N, K), targets (N,))``. MAUC keeps every probability
    vector until ``compute`` (N x K floats per test experience), which is why it is opt-in for
    the class-imbalance streams that the thesis scores with it.
    """
    metrics = {"acc": MulticlassAccuracy(num_classes, average="micro")}
    if imbalance:
        metrics["gmean"] = GeometricMean(num_classes)
        metrics["mauc"] = MulticlassMAUC(num_classes, input="logits")
    return MetricCollection(metrics)
