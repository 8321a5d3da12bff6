"""TRACE's per-task text metrics: hand-computed values, SARI's published example, TRACE's Py150
literal handling, and states that merge exactly (what DDP's sum reduction does)."""

from __future__ import annotations

import math

import pytest
import torch

from clbench.errors import UserError
from clbench.metrics.text import TEXT_METRICS, TRACE_TASK_METRICS, make_text_metric
from clbench.metrics.text_scores import (SARI, AnswerLetterAccuracy, EditSimilarity, ExactMatch, RougeL, answer_letter,
                                         py150_postprocess, sari_sentence, tokenize_13a)


def mean_of(metric, preds, targets, sources=None) -> float:
    metric.update(preds, targets, sources)
    return float(metric.compute())


def test_exact_match_strips_and_counts_empty_as_wrong():
    preds = ["42", " A \n", "", "B", "7"]
    targets = ["42", "A", "", "C", "7.0"]
    assert ExactMatch().sample_scores(preds, targets) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert mean_of(ExactMatch(), preds, targets) == pytest.approx(2 / 5)


def test_answer_letter_reads_first_character_and_answer_prefix():
    assert answer_letter("A\nBecause the dog is a mammal.") == "A"
    assert answer_letter("  Answer: C because ...") == "C"
    assert answer_letter("") == ""
    preds = ["B\nBecause ...", "Answer: A", "C", "", "b"]
    targets = ["B\nBecause other words", "A", "Answer: D", "A", "B"]
    assert AnswerLetterAccuracy().sample_scores(preds, targets) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_rouge_l_f1_matches_hand_computed_lcs():
    # LCS(the cat sat on the mat, the cat is on the mat) = "the cat on the mat": P = R = 5/6.
    # LCS(a b c d, a c d e f) = "a c d": P = 3/4, R = 3/5, F = 2PR/(P+R) = 2/3.
    # Case and punctuation are not tokens: "The CAT, sat!" == "the cat sat".
    scores = RougeL().sample_scores(["the cat sat on the mat", "a b c d", "The CAT, sat!", "", "x"],
                                    ["the cat is on the mat", "a c d e f", "the cat sat", "the", ""])
    assert scores == pytest.approx([5 / 6, 2 / 3, 1.0, 0.0, 0.0], abs=1e-6)


def test_py150_literal_postprocessing_as_trace():
    assert py150_postprocess("x = <NUM_LIT>") == "x = 0"
    assert py150_postprocess("print ( <STR_LIT> , <CHAR_LIT> )") == "print (  ,  )"
    assert py150_postprocess("f ( <STR_LIT:hello world> , <NUM_LIT:3> , <CHAR_LIT:c> )") == "f ( hello world , 3 , c )"


def test_edit_similarity_is_truncated_indel_ratio_after_placeholders():
    metric = EditSimilarity()
    # Placeholders resolve before comparing, so these two are identical.
    assert metric.sample_scores(["x = <NUM_LIT>", "s = <STR_LIT:abc>"], ["x = 0", "s = abc"]) == [1.0, 1.0]
    # abc vs abd: indel distance 2 over 6 characters -> 66.67 -> rounded to 67 (fuzzywuzzy's
    # integer ratio) -> 0.67; unrounded 2/3.
    assert metric.sample_scores(["abc"], ["abd"]) == [0.67]
    assert EditSimilarity(round_percent=False).sample_scores(["abc"], ["abd"]) == pytest.approx([2 / 3])
    # An empty prediction, or one that is empty after post-processing, scores 0.
    assert metric.sample_scores(["", "<STR_LIT>", "x"], ["x", "x", ""]) == [0.0, 0.0, 0.0]


def test_sari_reproduces_the_published_reference_example():
    # The example of Hugging Face's `sari` metric card and of EASSE's README: 26.953601953601954.
    score = sari_sentence("About 95 species are currently accepted.", "About 95 you now get in.",
                          ["About 95 species are currently known.", "About 95 species are now accepted.",
                           "95 species are now accepted."])
    assert 100 * score == pytest.approx(26.953601953601954, abs=1e-12)


@pytest.mark.parametrize("source, prediction, references, expected", [
    # Perfect deletion: every order scores 1.
    ("a b", "a", ["a"], 1.0),
    # A copy: unigram keep P = 1/2, R = 1 -> F = 2/3; bigram keep P = 0, R = 0/0 = 1 -> F = 0;
    # keep mean (2/3 + 0 + 1 + 1) / 4 = 2/3; delete and add 1 -> (2/3 + 1 + 1) / 3 = 8/9.
    ("a b", "a b", ["a"], 8 / 9),
    # A wrong addition: add F = 0 for 1- and 2-grams, 1 for 3/4-grams -> (1 + 1 + 1/2) / 3.
    ("a", "a d", ["a c"], 2.5 / 3),
    # Two references (counts weighed by 2): keep mean 0.7, delete mean 0.75, add 1.
    ("a b", "a", ["a", "a b"], 2.45 / 3),
])
def test_sari_matches_hand_computed_cases(source, prediction, references, expected):
    assert sari_sentence(source, prediction, references) == pytest.approx(expected, abs=1e-12)


def test_sari_metric_needs_sources_and_averages_sentences():
    metric = SARI()
    with pytest.raises(ValueError, match="sources"):
        metric.update(["a"], ["a"])
    metric.update(["a", "a b"], ["a", "a"], sources=["a b", "a b"])
    assert float(metric.compute()) == pytest.approx((1 + 8 / 9) / 2, abs=1e-9)
    # A list of references per sample is accepted too.
    assert SARI().sample_scores(["a"], [["a", "a b"]], ["a b"]) == pytest.approx([2.45 / 3])


def test_tokenize_13a_matches_torchmetrics_sacrebleu_tokenizer():
    tm = pytest.importorskip("torchmetrics.functional.text.sacre_bleu")
    for text in ["Hello, world! 3.14 and 1,000 - e.g. (x) a-b 5-6 \"q\" &amp; <a> {b} [c] ~ `x` wait...",
                 "Der Hund bellt; laut: ja? 20 Minuten, 12.5%"]:
        assert tokenize_13a(text).split() == list(tm._SacreBLEUTokenizer.tokenize(text, "13a"))


def _batches():
    preds = ["x = <NUM_LIT>", "The council voted.", "A", "Answer: B", "12", "der hund", "", "abc"]
    targets = ["x = 0", "The council voted to approve it.", "A", "C", "12", "Der Hund bellt.", "x", "abd"]
    sources = [f"source {i} der hund bellt laut" for i in range(len(preds))]
    return preds, targets, sources


@pytest.mark.parametrize("name", sorted(TEXT_METRICS))
def test_states_merge_exactly_as_under_ddp(name):
    preds, targets, sources = _batches()
    whole = make_text_metric(name)
    whole.update(preds, targets, sources)
    first, second = make_text_metric(name), make_text_metric(name)
    first.update(preds[:3], targets[:3], sources[:3])  # rank 0's shard
    second.update(preds[3:], targets[3:], sources[3:])  # rank 1's shard
    first.merge_state(second)  # the dist_reduce_fx ("sum") of every state
    assert torch.equal(first.total, whole.total) and torch.equal(first.count, whole.count)
    assert torch.equal(first.compute(), whole.compute())
    value = float(whole.compute())
    assert 0.0 <= value <= 1.0
    assert value == pytest.approx(sum(whole.sample_scores(preds, targets, sources)) / len(preds), abs=1e-9)


def test_states_are_integers_that_a_bf16_module_cast_leaves_alone():
    metric = RougeL()
    metric.update(["the cat sat on the mat"], ["the cat is on the mat"])
    holder = torch.nn.Module()
    holder.metric = metric
    holder.to(torch.bfloat16)
    assert metric.total.dtype == torch.long and metric.count.dtype == torch.long
    assert float(metric.compute()) == pytest.approx(5 / 6, abs=1e-6)  # torchmetrics scores in float32


def test_compute_before_update_is_nan_and_reset_clears():
    metric = ExactMatch()
    with pytest.warns(UserWarning):  # torchmetrics warns about compute() before update()
        assert math.isnan(float(metric.compute()))
    metric.update(["a"], ["a"])
    metric.reset()
    metric.update(["a"], ["b"])
    assert float(metric.compute()) == 0.0


def test_update_rejects_mismatched_or_non_string_inputs():
    with pytest.raises(ValueError, match="2 predictions but 1 targets"):
        ExactMatch().update(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="list of strings"):
        ExactMatch().update("ab", "ab")


def test_factory_and_trace_task_mapping():
    assert set(TRACE_TASK_METRICS) == {"C-STANCE", "FOMC", "MeetingBank", "Py150", "ScienceQA", "NumGLUE-cm",
                                       "NumGLUE-ds", "20Minuten"}
    assert TRACE_TASK_METRICS["MeetingBank"] == "rouge_l" and TRACE_TASK_METRICS["20Minuten"] == "sari"
    assert TRACE_TASK_METRICS["Py150"] == "edit_similarity" and TRACE_TASK_METRICS["ScienceQA"] == "answer_letter"
    for task in ("FOMC", "NumGLUE-cm", "NumGLUE-ds"):
        assert TRACE_TASK_METRICS[task] == "exact_match"
    for name in TRACE_TASK_METRICS.values():
        metric = make_text_metric(name)
        assert isinstance(metric, TEXT_METRICS[name]) and metric.higher_is_better
    with pytest.raises(UserError, match="did you mean 'rouge_l'") as err:
        make_text_metric("rougel")
    assert err.value.exit_code == 2 and "\n" not in str(err.value)


def test_lazy_exports():
    import clbench.metrics as metrics

    assert metrics.SARI is SARI and metrics.make_text_metric is make_text_metric
    assert metrics.TRACE_TASK_METRICS is TRACE_TASK_METRICS
