"""clbench metrics: torchmetrics classes for evaluation, pure functions for CL scores.

- :class:`GeometricMean`, :class:`MulticlassMAUC`: imbalance-aware classification metrics
  (DDP-safe ``torchmetrics.Metric`` subclasses, functional twins in
  :mod:`clbench.metrics.functional`).
- :func:`make_eval_metrics`: the per-test-experience ``MetricCollection`` the harness uses.
- :func:`declare`: a metric's title, direction and unit, read from its class (or given), and how
  an objective or a strategy adds metrics to every test column (``extra_metrics``);
  :func:`declare_routing`: a metric computed from each evaluation pass's routing records
  (a :class:`RoutingPass`), declared the same way.
- :func:`cl_scores`: every CL score of an R matrix (NumPy only); :func:`trace_task_scores`:
  OP and BWT with their per-task terms, as TRACE papers report them.
- :class:`ExpertUtilization`, :mod:`clbench.metrics.routing` (:class:`RoutingRecorder`) and the
  :class:`RoutingRecording` callback: per-domain expert utilization fed by what MoE layers
  report through :mod:`clbench.models.routing_channel`.
- :func:`effective_compositions`: MH-MoE's route-wise N_eff.
- :class:`ExactMatch`, :class:`AnswerLetterAccuracy`, :class:`RougeL`, :class:`EditSimilarity`,
  :class:`SARI`, :func:`make_text_metric`: TRACE's per-task scores of generated text
  (:mod:`clbench.metrics.text`); :func:`trace_score`: a task's score exactly as TRACE's own
  evaluation scripts compute it.

Names load on first access, so ``from clbench.metrics import cl_scores`` does not import torch.
Formulas, sources and sign conventions: ``docs/metrics.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "GeometricMean": "clbench.metrics.gmean",
    "MulticlassMAUC": "clbench.metrics.mauc",
    "ExpertUtilization": "clbench.metrics.utilization",
    "RoutingRecorder": "clbench.metrics.routing",
    "RoutingRecording": "clbench.metrics.routing_recording",
    "make_eval_metrics": "clbench.metrics.collection",
    "declare": "clbench.metrics.declared",
    "declare_routing": "clbench.metrics.declared",
    "RoutingPass": "clbench.metrics.declared",
    "MetricSpec": "clbench.metrics.declared",
    "cl_scores": "clbench.metrics.scores",
    "CL_SCORE_CRITERIA": "clbench.metrics.scores",
    "DEFAULT_CL_SCORE_WEIGHTS": "clbench.metrics.scores",
    "SCORE_KEYS": "clbench.metrics.scores",
    "trace_task_scores": "clbench.metrics.scores",
    "effective_compositions": "clbench.metrics.compositions",
    "Compositions": "clbench.metrics.compositions",
    "ExactMatch": "clbench.metrics.text_scores",
    "AnswerLetterAccuracy": "clbench.metrics.text_scores",
    "RougeL": "clbench.metrics.text_scores",
    "EditSimilarity": "clbench.metrics.text_scores",
    "SARI": "clbench.metrics.text_scores",
    "make_text_metric": "clbench.metrics.text",
    "TEXT_METRICS": "clbench.metrics.text",
    "TRACE_TASK_METRICS": "clbench.metrics.text",
    "TRACE_SCORED_METRICS": "clbench.metrics.text",
    "TRACE_SCORINGS": "clbench.metrics.text",
    "trace_score": "clbench.metrics.text",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'clbench.metrics' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
