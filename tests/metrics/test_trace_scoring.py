"""``trace_score`` against TRACE's evaluation, rebuilt here from the libraries TRACE used.

The reference side below follows the TRACE repository's ``metrics.py`` and
``evaluations/eval_<Task>.py`` step by step, with the real ``rouge`` 1.0.1 (MeetingBank),
``fuzzywuzzy`` without python-Levenshtein (Py150) and sacreBLEU's 13a tokenizer under Hugging
Face's ``sari`` formulas (20Minuten). ``fuzzywuzzy`` and ``sacrebleu`` are test-only (the
``dev`` extra): fuzzywuzzy is GPL-2.0, so the package computes its ratio itself from difflib.
Cases are generated with the edge cases a small model produces: surrounding whitespace, case,
punctuation, empty strings, multi-line answers, explanations after a label, Py150 literals.
"""

from __future__ import annotations

import difflib
import random
import warnings
from collections import Counter

import pytest

from clbench.errors import UserError
from clbench.metrics.text import TEXT_METRICS, TRACE_SCORED_METRICS, TRACE_SCORINGS, TRACE_TASK_METRICS, trace_score
from clbench.metrics.trace_scores import fuzz_ratio, trace_py150_postprocess

with warnings.catch_warnings():  # "Using slow pure-python SequenceMatcher": the path TRACE ran
    warnings.simplefilter("ignore")
    from fuzzywuzzy import fuzz
from rouge import Rouge
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a


# -- TRACE's evaluation, rebuilt ---------------------------------------------------------
def _trace_mean(pair_score, predictions, references):
    """metrics.py's means: pairs with an empty side add nothing, the divisor is every pair."""
    total = 0
    for prediction, reference in zip(predictions, references):
        if prediction == "" or reference == "":
            continue
        total += pair_score(prediction, reference)
    return total / len(predictions)


def _accuracy(predictions, references):
    return _trace_mean(lambda p, r: 1 if p == r else 0, predictions, references)


def _rouge(predictions, references):
    def pair(prediction, reference):
        try:  # score_rouge(target, prediction): the reference goes in the hypothesis slot
            return Rouge(metrics=["rouge-l"]).get_scores(reference, prediction, avg=True)["rouge-l"]["f"]
        except ValueError:  # TRACE stops here; the package scores such a pair 0
            return 0.0
    return _trace_mean(pair, predictions, references)


def _py150_literals(code):
    import re

    code = code.replace("<NUM_LIT>", "0").replace("<STR_LIT>", "").replace("<CHAR_LIT>", "")
    for kind, value in re.findall(re.compile(r"<(STR|NUM|CHAR)_LIT:(.*?)>", re.S), code):
        code = code.replace("<" + kind + "_LIT:" + value + ">", value)
    return code


def _fuzz(predictions, references):
    outputs = [_py150_literals(p) for p in predictions]
    gts = [_py150_literals(r) for r in references]
    return _trace_mean(fuzz.ratio, outputs, gts) / 100  # TRACE reports 0-100


def _sari_hf(sources, predictions, references):
    """Hugging Face ``sari`` (what ``load_metric("sari")`` runs): lower-case + 13a, then per
    n-gram order keep F1 (recall over all reference-supported source n-grams), deletion
    precision, addition F1 with 0/0 = 1, averaged; 100 x the mean over pairs."""
    tok = Tokenizer13a()

    def grams(tokens, n):
        return [" ".join(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]

    def order(s, c, refs):
        k = len(refs)
        r_count = Counter(g for ref in refs for g in ref)
        s_rep = Counter({g: v * k for g, v in Counter(s).items()})
        c_rep = Counter({g: v * k for g, v in Counter(c).items()})
        keep, keep_all = s_rep & c_rep, s_rep & r_count
        keep_good = keep & r_count
        kp = sum(keep_good[g] / keep[g] for g in keep_good) / len(keep) if len(keep) else 1
        kr = sum(keep_good.values()) / sum(keep_all.values()) if len(keep_all) else 1
        kf = 2 * kp * kr / (kp + kr) if kp > 0 or kr > 0 else 0
        dele = s_rep - c_rep
        del_good = dele - r_count
        dp = sum(del_good[g] / dele[g] for g in del_good) / len(dele) if len(dele) else 1
        added = set(c_rep) - set(s_rep)
        added_good = added & set(r_count)
        addable = set(r_count) - set(s_rep)
        ap = len(added_good) / len(added) if added else 1
        ar = len(added_good) / len(addable) if addable else 1
        af = 2 * ap * ar / (ap + ar) if ap > 0 or ar > 0 else 0
        return kf, dp, af

    total = 0.0
    for source, prediction, ref_list in zip(sources, predictions, references):
        s = tok(source.lower()).split(" ")
        c = tok(prediction.lower()).split(" ")
        rs = [tok(r.lower()).split(" ") for r in ref_list]
        parts = [order(grams(s, n), grams(c, n), [grams(r, n) for r in rs]) for n in (1, 2, 3, 4)]
        total += sum(sum(p[i] for p in parts) / 4 for i in range(3)) / 3
    return 100 * total / len(predictions)


def trace_reference(task, predictions, references, sources=None):
    """TRACE's reported score of ``task``, as a fraction."""
    if task in ("C-STANCE", "FOMC", "NumGLUE-cm", "NumGLUE-ds"):
        return _accuracy(predictions, references)
    if task == "ScienceQA":  # resolve(): datium[0] (an empty string has none: TRACE fails)
        return _accuracy([p[:1] for p in predictions], [r[:1] for r in references])
    if task == "MeetingBank":
        return _rouge(predictions, references)
    if task == "Py150":
        return _fuzz(predictions, references)
    if task == "20Minuten":
        return _sari_hf(sources, predictions, [[r] for r in references]) / 100
    raise AssertionError(task)


# -- generated cases ---------------------------------------------------------------------
def _variants(rng, answer):
    """What a small model makes of ``answer``: itself, padded, re-cased, punctuated, empty,
    explained, cut, multi-line."""
    return [answer, " " + answer, answer + " ", answer + "\n", answer.lower(), answer.upper(), answer + ".",
            "", " ", answer + "\nBecause it says so.", answer[: max(1, len(answer) // 2)],
            answer.replace(" ", "  "), "\n" + answer, answer + ". " + answer, rng.choice(["A", "B", "C", "x"])]


def _cases(task, seed=0):
    rng = random.Random(f"{task}/{seed}")
    if task in ("C-STANCE", "FOMC"):
        refs = ["A", "B", "C"]
    elif task == "ScienceQA":
        refs = ["A", "B\nBecause a whale is a mammal.", "C", "D\n", ""]
    elif task.startswith("NumGLUE"):
        refs = ["12", "7", "3.5", "-4", "1,000"]
    elif task == "MeetingBank":
        refs = ["The council voted to approve the budget.",
                "The council voted to approve the budget. The clerk read the agenda.",
                "the Council voted to reject a contract for street repairs",
                "Speaker 3 raised a concern about parking.\nThe council voted to delay the bike share pilot.",
                "...", "approve approve approve the the budget"]
    elif task == "Py150":
        refs = ["return self . count <EOL>", "self . name = value <EOL>", "total += x <EOL>",
                "show_size ( <NUM_LIT:42> ) <EOL>", "print ( <STR_LIT:hello world> , <NUM_LIT> ) <EOL>",
                "c = <CHAR_LIT:a> + <STR_LIT> <EOL>", "x = <STR_LIT:multi\nline> <EOL>",
                "<STR_LIT:<NUM_LIT:1>> <NUM_LIT:1>",  # a value that rebuilds a later literal
                "def f ( a , b ) : <EOL> return a + b " * 12]  # > 200 characters: difflib's autojunk
    else:  # 20Minuten
        refs = ["Der Arzt lacht laut.", "Das Auto fährt schnell. Das Kind singt gern.", "Die Polizei wartet.",
                "Das Volk spricht, laut & ruhig: \"ja\"."]
    preds, targets = [], []
    for ref in refs:
        for pred in _variants(rng, ref) if ref else ["", "A", " A"]:
            preds.append(pred)
            targets.append(ref)
    if task == "Py150":  # literals on the prediction side as well, and a literal pair that post-processes to ""
        extra = [("return <STR_LIT:abc> <EOL>", "return abc <EOL>"), ("<STR_LIT>", "<STR_LIT>"),
                 ("<STR_LIT:>", "x"), ("x = <NUM_LIT:1", "x = 1"), ("<NUM_LIT:2><NUM_LIT:2>", "22")]
        preds += [p for p, _ in extra]
        targets += [t for _, t in extra]
    sources = None
    if task == "20Minuten":
        sources = [f"Provide a simplified version of the following paragraph in German.\n\n{t} heute Morgen sehr."
                   for t in targets]
    return preds, targets, sources


@pytest.mark.parametrize("task", list(TRACE_SCORED_METRICS))
def test_trace_score_equals_trace_evaluation_on_generated_cases(task):
    preds, targets, sources = _cases(task)
    assert len(preds) >= 40
    expected = trace_reference(task, preds, targets, sources)
    assert trace_score(task, preds, targets, sources) == pytest.approx(expected, abs=1e-9, rel=0)
    # and pair by pair (a mean that hides offsetting errors would pass the line above)
    for i, (p, t) in enumerate(zip(preds, targets)):
        s = None if sources is None else [sources[i]]
        assert trace_score(task, [p], [t], s) == pytest.approx(trace_reference(task, [p], [t], s), abs=1e-9, rel=0), \
            (p, t)


@pytest.mark.parametrize("task", list(TRACE_SCORED_METRICS))
def test_the_two_scorings_differ_on_the_same_cases(task):
    """Normalized scoring is the lenient one: it never scores the classification-like tasks
    lower than TRACE's, and differs somewhere on these cases for every task but 20Minuten
    (whose SARI is the same computation in both)."""
    preds, targets, sources = _cases(task)
    trace = trace_score(task, preds, targets, sources)
    normalized = TEXT_METRICS[TRACE_TASK_METRICS[task]]().sample_scores(preds, targets, sources)
    normalized = sum(normalized) / len(normalized)
    if task == "20Minuten":
        assert normalized == pytest.approx(trace, abs=1e-12)
    else:
        assert normalized != pytest.approx(trace, abs=1e-6)
    if task in ("C-STANCE", "FOMC", "NumGLUE-cm", "NumGLUE-ds", "ScienceQA"):
        assert normalized > trace


def test_fuzz_ratio_is_fuzzywuzzys_difflib_ratio():
    assert fuzz.SequenceMatcher is difflib.SequenceMatcher  # no python-Levenshtein, as in TRACE
    rng = random.Random(1)
    alphabet = "ab c.\n<>_"
    for _ in range(300):
        a = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 260)))
        b = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 260)))
        assert fuzz_ratio(a, b) == fuzz.ratio(a, b)
        assert fuzz_ratio(a, a) == fuzz.ratio(a, a) == 100


def test_py150_literals_are_replaced_in_turn_as_trace_does():
    # One pass would leave "<NUM_LIT:1> 1"; TRACE replaces found literals one after another.
    assert trace_py150_postprocess("<STR_LIT:<NUM_LIT:1>> <NUM_LIT:1>") == "1 1"
    assert trace_py150_postprocess("f ( <STR_LIT:a\nb> , <NUM_LIT> , <CHAR_LIT> )") == "f ( a\nb , 0 ,  )"


def test_13a_tokenizer_equals_sacrebleus():
    from clbench.metrics.text_scores import tokenize_13a

    tok = Tokenizer13a()
    for text in ["Das Volk spricht, laut & ruhig: \"ja\".", "1,000.5 - 3-4 a.b", "x &amp; y &lt;z&gt; &quot;",
                 "zeile-\numbruch\nneu", "<skipped> ok", "", "  äusserst  überaus!?", "(a) [b] {c} $d% e/f"]:
        assert tokenize_13a(text) == tok(text)


def test_scorings_cover_every_task_and_unknown_task_is_a_user_error():
    assert set(TRACE_SCORINGS["trace"]) == set(TRACE_SCORINGS["normalized"])
    assert all(TEXT_METRICS[name].scoring == "trace" for name in TRACE_SCORINGS["trace"].values())
    assert all(TEXT_METRICS[name].scoring == "normalized" for name in TRACE_SCORINGS["normalized"].values())
    with pytest.raises(UserError, match="unknown TRACE task 'FOMCC'"):
        trace_score("FOMCC", ["A"], ["A"])
