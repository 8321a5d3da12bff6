"""Per-task scores of generated text (TRACE's metrics) as DDP-safe torchmetrics ``Metric`` s.

Every metric is a mean of a per-sample score in [0, 1] over the evaluated samples. The two
states are integers summed across processes: ``total`` (the scores in units of 1e-9) and
``count``. Integer sums are exact and order-independent, so the value under DDP equals the
single-process value bit for bit, and casting a module to bf16 cannot round them.

``update(preds, targets, sources=None)`` takes lists of strings; only SARI reads ``sources``
(the model's input; TRACE passes the whole prompt).

Two scorings of the TRACE tasks (:data:`TRACE_SCORINGS`):

- ``trace`` (the ``Trace*`` classes, :func:`trace_score`): exactly what the TRACE repository's
  evaluation scripts compute, so numbers sit next to published ones. Raw strings, nothing
  stripped; an empty prediction or reference scores 0 with the divisor unchanged (not for SARI).
- ``normalized`` (the other classes): lenient; surrounding whitespace stripped, an empty
  (stripped) prediction or reference scores 0 (not for SARI). Where and why they differ from
  TRACE's scripts: the class docstrings and ``docs/language-models.md``.
"""

from __future__ import annotations

from typing import Any, Sequence

from clbench.errors import UserError, did_you_mean
from clbench.metrics.text_scores import SARI, AnswerLetterAccuracy, EditSimilarity, ExactMatch, MeanTextScore, RougeL
from clbench.metrics.trace_scores import (TraceEditSimilarity, TraceExactMatch, TraceFirstCharacter, TraceRougeL,
                                          TraceSARI)

TEXT_METRICS: dict[str, type[MeanTextScore]] = {
    "exact_match": ExactMatch,
    "answer_letter": AnswerLetterAccuracy,
    "rouge_l": RougeL,
    "edit_similarity": EditSimilarity,
    "sari": SARI,
    "trace_exact_match": TraceExactMatch,
    "trace_first_char": TraceFirstCharacter,
    "trace_rouge_l": TraceRougeL,
    "trace_edit_similarity": TraceEditSimilarity,
    "trace_sari": TraceSARI,
}

#: TRACE's primary metric per task (C-STANCE's answers are letters, scored by TRACE on the
#: first character of the generation: exact match after TRACE's normalisation).
TRACE_TASK_METRICS: dict[str, str] = {
    "C-STANCE": "answer_letter",
    "FOMC": "exact_match",
    "MeetingBank": "rouge_l",
    "Py150": "edit_similarity",
    "ScienceQA": "answer_letter",
    "NumGLUE-cm": "exact_match",
    "NumGLUE-ds": "exact_match",
    "20Minuten": "sari",
}


#: TRACE's own scoring per task (``scoring: trace``, the default of the TRACE streams).
TRACE_SCORED_METRICS: dict[str, str] = {
    "C-STANCE": "trace_exact_match",
    "FOMC": "trace_exact_match",
    "MeetingBank": "trace_rouge_l",
    "Py150": "trace_edit_similarity",
    "ScienceQA": "trace_first_char",
    "NumGLUE-cm": "trace_exact_match",
    "NumGLUE-ds": "trace_exact_match",
    "20Minuten": "trace_sari",
}

#: Task metrics of each scoring of the TRACE streams: ``trace`` (TRACE's scripts, comparable
#: with published numbers) and ``normalized`` (lenient: stripped answers, the first non-blank
#: character for letter answers, torchmetrics' ROUGE-L, rapidfuzz's ratio).
TRACE_SCORINGS: dict[str, dict[str, str]] = {"trace": TRACE_SCORED_METRICS, "normalized": TRACE_TASK_METRICS}


def trace_score(task: str, predictions: Sequence[str], references: Sequence[str],
                sources: Sequence[str] | None = None) -> float:
    """TRACE's primary score of ``task`` as a fraction in [0, 1]: the per-pair scores of
    :data:`TRACE_SCORED_METRICS` summed and divided by the number of pairs, as TRACE's
    ``metrics.py`` divides by ``len(results)``. ``sources`` (the prompts) only for 20Minuten.
    No pairs: NaN."""
    name = TRACE_SCORED_METRICS.get(task)
    if name is None:
        raise UserError(f"unknown TRACE task '{task}'", where="task", fix=did_you_mean(task, TRACE_SCORED_METRICS))
    scores = TEXT_METRICS[name]().sample_scores(predictions, references, sources)
    return sum(scores) / len(scores) if scores else float("nan")


def make_text_metric(name: str, **kwargs: Any) -> MeanTextScore:
    """A fresh metric by name (see :data:`TEXT_METRICS`)."""
    cls = TEXT_METRICS.get(name)
    if cls is None:
        raise UserError(f"unknown text metric '{name}'", where="task_metrics", fix=did_you_mean(name, TEXT_METRICS))
    return cls(**kwargs)
