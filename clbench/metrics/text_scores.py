"""The per-sample text scores behind every text metric, and the project's lenient scoring
(``scoring: normalized``): exact match, answer letter, ROUGE-L, edit similarity and SARI.

:class:`MeanTextScore` is the DDP-safe torchmetrics base of all of them (integer states, see
:mod:`clbench.metrics.text`); the scores of TRACE's own scripts subclass it in
:mod:`clbench.metrics.trace_scores`.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from typing import Any, Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

#: Scores are stored as integers in units of 1 / SCALE.
SCALE = 10**9


class MeanTextScore(Metric):
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
    total_sq: Tensor  # the squares' sum, for the standard error of the mean (clbench.metrics.stderr)
    count: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total_sq", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
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
        self.total_sq += sum(int(round(s * s * SCALE)) for s in scores)
        self.count += len(scores)

    def compute(self) -> Tensor:
        if int(self.count) == 0:
            return torch.tensor(float("nan"), dtype=torch.float64, device=self.count.device)
        return self.total.double() / SCALE / self.count.double()


def _as_strings(values: Sequence[str], what: str) -> list[str]:
    if isinstance(values, str) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{what} must be a list of strings")
    return list(values)


class ExactMatch(MeanTextScore):
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


class AnswerLetterAccuracy(MeanTextScore):
    """1 when the prediction's answer letter equals the reference's (:func:`answer_letter`).

    TRACE scores ScienceQA ("A\\nBecause ...") and C-STANCE (answers A/B/C) on the first
    character of the generation, so an answer followed by an explanation still counts.
    """

    def score(self, pred: str, target: str, source: str | None = None) -> float:
        p, t = answer_letter(pred), answer_letter(target)
        return float(bool(p) and bool(t) and p == t)


class RougeL(MeanTextScore):
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


class EditSimilarity(MeanTextScore):
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


def tokenize_13a(text: str) -> str:
    """``text`` tokenised as mteval-v13a does (sacreBLEU's "13a"), tokens joined by single spaces."""
    return _tokenizer_13a()(text)


@functools.lru_cache(maxsize=1)
def _tokenizer_13a():
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    return Tokenizer13a()


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


class SARI(MeanTextScore):
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
