"""TRACE's own evaluation scripts as metrics (``scoring: trace``): exactly what the TRACE
repository's ``eval_*.py`` compute, so numbers sit next to published ones. Raw strings,
nothing stripped; an empty prediction or reference scores 0 with the divisor unchanged (not for
SARI). The lenient forms are in :mod:`clbench.metrics.text_scores`.
"""

from __future__ import annotations

import re

from clbench.metrics.text_scores import SARI, MeanTextScore

class TraceExactMatch(MeanTextScore):
    """TRACE's ``caculate_accuracy`` (``metrics.py``; ``eval_CStance.py``, ``eval_FOMC.py``,
    ``eval_NumGLUE_cm.py``, ``eval_NumGLUE_ds.py``): 1 when the raw prediction equals the raw
    reference and neither is empty. Case, whitespace and punctuation all count."""

    scoring = "trace"

    def score(self, pred: str, target: str, source: str | None = None) -> float:
        return float(pred != "" and target != "" and pred == target)


class TraceFirstCharacter(MeanTextScore):
    """TRACE's ScienceQA accuracy (``eval_ScienceQA.py``): ``caculate_accuracy`` on the first
    character of the prediction and of the reference (the answer letter of "A\nBecause ...").
    An empty side scores 0 (TRACE's script fails on it)."""

    scoring = "trace"

    def score(self, pred: str, target: str, source: str | None = None) -> float:
        return float(pred != "" and target != "" and pred[0] == target[0])


def trace_rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F of one pair as TRACE's ``score_rouge`` gets it from the ``rouge`` package
    (1.0.1): ``Rouge(metrics=["rouge-l"]).get_scores(reference, prediction, avg=True)``, the
    reference in the hypothesis slot as TRACE passes it. The package splits each text into
    sentences at '.', words at single spaces, and takes the summary-level union LCS over
    *sets* of words; F = 2PR / (P + R + 1e-8). A text without any sentence (empty, or only
    periods) scores 0; TRACE's script fails on it."""
    from rouge import Rouge

    try:
        scores = Rouge(metrics=["rouge-l"]).get_scores(reference, prediction, avg=True)
    except ValueError:  # "Collections must contain at least 1 sentence."
        return 0.0
    return float(scores["rouge-l"]["f"])


class TraceRougeL(MeanTextScore):
    """TRACE's MeetingBank score (``eval_MeetingBank.py`` -> ``metrics.caculate_rouge``): the
    mean of :func:`trace_rouge_l` over every pair, empty prediction or reference scoring 0."""

    scoring = "trace"

    def score(self, pred: str, target: str, source: str | None = None) -> float:
        if pred == "" or target == "":
            return 0.0
        return trace_rouge_l(pred, target)


_TRACE_LITERAL = re.compile(r"<(STR|NUM|CHAR)_LIT:(.*?)>", re.S)


def trace_py150_postprocess(code: str) -> str:
    """Py150's literal handling as ``eval_Py150.py`` performs it: bare ``<NUM_LIT>`` becomes
    ``0``, bare ``<STR_LIT>``/``<CHAR_LIT>`` vanish; then every ``<KIND_LIT:value>`` found (a
    non-greedy match, across lines) is replaced, one found literal after another, by its value
    everywhere in the text. Replacing in turn, not in one pass, is what TRACE does: a value that
    rebuilds an earlier literal's text is replaced again (:func:`py150_postprocess` is the
    one-pass form of the normalized scoring)."""
    code = code.replace("<NUM_LIT>", "0").replace("<STR_LIT>", "").replace("<CHAR_LIT>", "")
    for kind, value in _TRACE_LITERAL.findall(code):
        code = code.replace(f"<{kind}_LIT:{value}>", value)
    return code


def fuzz_ratio(a: str, b: str) -> int:
    """fuzzywuzzy's ``fuzz.ratio(a, b)`` as it computes without python-Levenshtein (TRACE's
    requirements do not install it): 100 for equal strings, 0 when either is empty, else
    ``int(round(100 * difflib.SequenceMatcher(None, a, b).ratio()))`` (difflib's default
    autojunk heuristic included; Python's round-half-to-even). Order matters: ``b`` is the
    sequence difflib indexes."""
    import difflib

    if a == b:
        return 100
    if not a or not b:
        return 0
    return int(round(100 * difflib.SequenceMatcher(None, a, b).ratio()))


class TraceEditSimilarity(MeanTextScore):
    """TRACE's Py150 similarity (``eval_Py150.py`` -> ``metrics.caculate_fuzz``): both sides
    through :func:`trace_py150_postprocess`, then ``fuzz.ratio(prediction, reference)``
    (:func:`fuzz_ratio`, whole percents), 0 when either post-processed side is empty; TRACE
    reports the mean on 0-100, here divided by 100."""

    scoring = "trace"

    def score(self, pred: str, target: str, source: str | None = None) -> float:
        pred, target = trace_py150_postprocess(pred), trace_py150_postprocess(target)
        if pred == "" or target == "":
            return 0.0
        return fuzz_ratio(pred, target) / 100.0


class TraceSARI(SARI):
    """TRACE's 20Minuten score (``eval_20Minuten.py`` -> ``metrics.caculate_sari``): Hugging
    Face's ``sari`` metric (``datasets.load_metric("sari")``) with the prompt as source and the
    reference as the single reference, i.e. :func:`sari_sentence` averaged over every pair (no
    pair skipped). TRACE reports 100 x the mean (inside a 1-tuple); here the fraction."""

    scoring = "trace"
