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

import re
from collections import Counter
from typing import Any, Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from clbench.errors import UserError, did_you_mean

#: Scores are stored as integers in units of 1 / SCALE.
SCALE = 10**9


class _MeanTextScore(Metric):
    """Mean of :meth:`score` over every (pred, target[, source]) seen; NaN before any update."""

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0
    needs_sources = False
    #: "trace": scored as TRACE's own scripts score, on the generation as decoded (nothing
    #: stripped); "normalized": the project's lenient form.
    scoring = "normalized"

    total: Tensor
    count: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def score(self, pred: str, target: str, source: str | None = None) -> float:  # pragma: no cover
        raise NotImplementedError

    def sample_scores(self, preds: Sequence[str], targets: Sequence[Any],
                      sources: Sequence[str] | None = None) -> list[float]:
        """The per-sample scores (e.g. to save next to the generations); no state change."""
        preds = _as_strings(preds, "preds")
        targets = list(targets) if self.needs_sources else _as_strings(targets, "targets")
        if len(preds) != len(targets):
            raise ValueError(f"{len(preds)} predictions but {len(targets)} targets")
        if self.needs_sources:
            if sources is None:
                raise ValueError(f"{type(self).__name__} needs the sources (the model inputs) too")
            sources = _as_strings(sources, "sources")
            if len(sources) != len(preds):
                raise ValueError(f"{len(preds)} predictions but {len(sources)} sources")
            return [self.score(p, t, s) for p, t, s in zip(preds, targets, sources)]
        return [self.score(p, t) for p, t in zip(preds, targets)]

    def update(self, preds: Sequence[str], targets: Sequence[Any], sources: Sequence[str] | None = None,
               scores: Sequence[float] | None = None) -> None:
        """``scores``: the per-sample scores already computed by :meth:`sample_scores` for these
        pairs (a caller that keeps them need not score twice)."""
        if scores is None:
            scores = self.sample_scores(preds, targets, sources)
        elif len(scores) != len(preds):
            raise ValueError(f"{len(preds)} predictions but {len(scores)} scores")
        self.total += sum(int(round(s * SCALE)) for s in scores)
        self.count += len(scores)

    def compute(self) -> Tensor:
        if int(self.count) == 0:
            return torch.tensor(float("nan"), dtype=torch.float64, device=self.count.device)
        return self.total.double() / SCALE / self.count.double()


def _as_strings(values: Sequence[str], what: str) -> list[str]:
    if isinstance(values, str) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{what} must be a list of strings")
    return list(values)


class ExactMatch(_MeanTextScore):
    """1 when the prediction equals the reference (both stripped of surrounding whitespace).

    TRACE compares the raw strings (``prediction == target``); stripping only removes what the
    decoding of a separate answer span may add, and is applied to both sides.
    """

    def score(self, pred: str, target: str, source: str | None = None) -> float:
        pred, target = pred.strip(), target.strip()
        return float(bool(pred) and bool(target) and pred == target)


def answer_letter(text: str) -> str:
    """The answer letter of a choice answer: its first non-blank character, after an optional
    ``Answer:`` prefix (the form of TRACE's older ScienceQA references)."""
    text = text.strip()
    if text.startswith("Answer:"):
        text = text[len("Answer:"):].lstrip()
    return text[:1]


class AnswerLetterAccuracy(_MeanTextScore):
    """1 when the prediction's answer letter equals the reference's (:func:`answer_letter`).

    TRACE scores ScienceQA ("A\\nBecause ...") and C-STANCE (answers A/B/C) on the first
    character of the generation, so an answer followed by an explanation still counts.
    """

    def score(self, pred: str, target: str, source: str | None = None) -> float:
        p, t = answer_letter(pred), answer_letter(target)
        return float(bool(p) and bool(t) and p == t)


class RougeL(_MeanTextScore):
    """ROUGE-L F1 (Lin 2004; LCS of word tokens), per sample, from torchmetrics.

    Tokens are torchmetrics' defaults (lower-cased, split on anything that is not a-z or 0-9;
    no stemming, so no nltk data is needed). TRACE used the ``rouge`` package, which splits
    sentences on '.', keeps case and punctuation and weighs its F with beta = P/R; its values
    are therefore close to, not equal to, these.
    """

    def score(self, pred: str, target: str, source: str | None = None) -> float:
        from torchmetrics.functional.text.rouge import rouge_score

        pred, target = pred.strip(), target.strip()
        if not pred or not target:
            return 0.0
        return float(rouge_score([pred], [target], rouge_keys="rougeL")["rougeL_fmeasure"])


_LITERAL = re.compile(r"<(?:STR|NUM|CHAR)_LIT:(.*?)>", re.S)


def py150_postprocess(code: str) -> str:
    """TRACE's Py150 literal handling: bare ``<NUM_LIT>`` becomes ``0``, bare ``<STR_LIT>`` and
    ``<CHAR_LIT>`` vanish, and ``<KIND_LIT:value>`` becomes ``value``."""
    code = code.replace("<NUM_LIT>", "0").replace("<STR_LIT>", "").replace("<CHAR_LIT>", "")
    return _LITERAL.sub(lambda m: m.group(1), code)


class EditSimilarity(_MeanTextScore):
    """Py150's edit similarity: TRACE's literal post-processing on both sides, then the
    normalised indel similarity (rapidfuzz ``fuzz.ratio``, the measure fuzzywuzzy's ``ratio``
    computes), rounded to a whole percent as fuzzywuzzy returns it, then divided by 100.

    ``round_percent=False`` keeps the unrounded ratio.
    """

    def __init__(self, round_percent: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.round_percent = round_percent

    def score(self, pred: str, target: str, source: str | None = None) -> float:
        from rapidfuzz import fuzz

        pred, target = py150_postprocess(pred).strip(), py150_postprocess(target).strip()
        if not pred or not target:
            return 0.0
        ratio = fuzz.ratio(pred, target)
        return (round(ratio) if self.round_percent else ratio) / 100.0


# mteval-v13a tokenisation (as sacreBLEU's "13a"): punctuation split off, except '.' and ','
# between digits, and '-' split after a digit.
_13A_RULES = (
    (re.compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])"), r" \1 "),
    (re.compile(r"([^0-9])([\.,])"), r"\1 \2 "),
    (re.compile(r"([\.,])([^0-9])"), r" \1 \2"),
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),
)


def tokenize_13a(text: str) -> str:
    """``text`` tokenised as mteval-v13a does, tokens joined by single spaces."""
    text = text.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    if "&" in text:
        text = text.replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
    text = f" {text} "
    for pattern, replacement in _13A_RULES:
        text = pattern.sub(replacement, text)
    return " ".join(text.split())


def _f1(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if p > 0 or r > 0 else 0.0


def _sari_order(src: list[str], cand: list[str], refs: list[list[str]]) -> tuple[float, float, float]:
    """(keep F1, deletion precision, addition F1) for one n-gram order."""
    k = len(refs)  # source and candidate counts are weighed by the number of references
    s = Counter({g: c * k for g, c in Counter(src).items()})
    c = Counter({g: n * k for g, n in Counter(cand).items()})
    r = Counter(g for ref in refs for g in ref)

    keep, keep_all = s & c, s & r
    keep_good = keep & r
    p_keep = sum(keep_good[g] / keep[g] for g in keep) / len(keep) if keep else 1.0
    r_keep = sum(keep_good.values()) / sum(keep_all.values()) if keep_all else 1.0

    delete = s - c
    delete_good = delete - r
    p_del = sum(delete_good[g] / delete[g] for g in delete) / len(delete) if delete else 1.0

    added = set(c) - set(s)
    added_good = added & set(r)
    addable = set(r) - set(s)
    p_add = len(added_good) / len(added) if added else 1.0
    r_add = len(added_good) / len(addable) if addable else 1.0
    return _f1(p_keep, r_keep), p_del, _f1(p_add, r_add)


def sari_sentence(source: str, prediction: str, references: Sequence[str], *, normalize: bool = True) -> float:
    """SARI of one simplification in [0, 1] (Xu et al. 2016, TACL), in the form TRACE scores
    20Minuten with (Hugging Face's ``sari``, the tensor2tensor variant): texts lower-cased and
    13a-tokenised; n = 1..4; per order the F1 of kept n-grams (keep recall over all kept
    n-grams the references support), the precision of deleted n-grams and the F1 of added
    n-grams; 0/0 counts as 1; SARI = (mean keep + mean delete + mean add) / 3.
    """
    if not references:
        raise ValueError("SARI needs at least one reference")
    prep = (lambda t: tokenize_13a(t.lower())) if normalize else (lambda t: t)
    src, cand = prep(source).split(" "), prep(prediction).split(" ")
    refs = [prep(r).split(" ") for r in references]
    parts = []
    for n in range(1, 5):
        grams = lambda toks: [" ".join(toks[i:i + n]) for i in range(len(toks) - n + 1)]  # noqa: E731
        parts.append(_sari_order(grams(src), grams(cand), [grams(r) for r in refs]))
    keep, delete, add = (sum(p[i] for p in parts) / 4 for i in range(3))
    return (keep + delete + add) / 3


class SARI(_MeanTextScore):
    """Mean sentence SARI (:func:`sari_sentence`) of each prediction against its source and
    reference(s) (a string or a list of strings per sample); ``update`` needs ``sources``."""

    needs_sources = True

    def score(self, pred: str, target: Any, source: str | None = None) -> float:
        refs = [target] if isinstance(target, str) else list(target)
        return sari_sentence(source or "", pred, refs)


# -- TRACE's own scoring ------------------------------------------------------------------
# The classes below compute each task's primary score as the TRACE repository's evaluation
# scripts do (BeyonderXX/TRACE: ``metrics.py`` and ``evaluations/eval_<Task>.py``), on the
# generation as TRACE decodes it (nothing stripped). TRACE's means divide by every sample,
# skipping (scoring 0) the pairs where the prediction or the reference is the empty string,
# except SARI, computed on every pair. Where TRACE's script would raise (ScienceQA's first
# character of an empty string; a ROUGE text that has no sentence) the pair scores 0 here.


class TraceExactMatch(_MeanTextScore):
    """TRACE's ``caculate_accuracy`` (``metrics.py``; ``eval_CStance.py``, ``eval_FOMC.py``,
    ``eval_NumGLUE_cm.py``, ``eval_NumGLUE_ds.py``): 1 when the raw prediction equals the raw
    reference and neither is empty. Case, whitespace and punctuation all count."""

    scoring = "trace"

    def score(self, pred: str, target: str, source: str | None = None) -> float:
        return float(pred != "" and target != "" and pred == target)


class TraceFirstCharacter(_MeanTextScore):
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


class TraceRougeL(_MeanTextScore):
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


class TraceEditSimilarity(_MeanTextScore):
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


TEXT_METRICS: dict[str, type[_MeanTextScore]] = {
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


def make_text_metric(name: str, **kwargs: Any) -> _MeanTextScore:
    """A fresh metric by name (see :data:`TEXT_METRICS`)."""
    cls = TEXT_METRICS.get(name)
    if cls is None:
        raise UserError(f"unknown text metric '{name}'", where="task_metrics", fix=did_you_mean(name, TEXT_METRICS))
    return cls(**kwargs)
