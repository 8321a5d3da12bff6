"""The causal-LM objective: prompt-masked loss, truncation, batched greedy generation, and a
TRACE-format stream through the runner with checkpoints and generations."""

from __future__ import annotations

import contextlib
import copy
import functools
import json

import pytest
import torch
from clbench.objectives.text_batches import answer_window
from helpers import TINY_LM, crash_at, lm_objective, tiny_config, tiny_lm


@pytest.fixture(scope="module")
def model():
    return tiny_lm()


@contextlib.contextmanager
def decoding_steps(model):
    """The rows of each decoding step (a forward over one new token a row) of ``model``: its
    forward wrapped, not hooked (a forward hook makes the objective decode with ``generate``)."""
    steps, forward = [], model.hf.forward

    @functools.wraps(forward)  # its signature kept: generate and the objective read it
    def counted(*args, **kwargs):
        if kwargs["input_ids"].shape[1] == 1:
            steps.append(kwargs["input_ids"].shape[0])
        return forward(*args, **kwargs)

    model.hf.forward = counted
    try:
        yield steps
    finally:
        del model.hf.forward


def test_the_loss_is_on_answer_tokens_only_and_truncation_cuts_the_prompts_left(model):
    tok = model.tokenizer
    objective = lm_objective(model, max_length=12)
    records = [{"prompt": "one two three four five six seven eight nine", "answer": "ten"},
               {"prompt": "a b", "answer": "c d"}]
    batch = objective.collate(train=True)(records)
    answer = tok("ten", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    prompt = tok(records[0]["prompt"], add_special_tokens=False)["input_ids"]
    assert len(prompt) + len(answer) > 12
    row = batch["input_ids"][0].tolist()
    assert row == prompt[-(12 - len(answer)):] + answer  # the prompt's start is what goes
    labels = batch["labels"][0].tolist()
    assert labels == [-100] * (12 - len(answer)) + answer
    # the short record: right padding, masked out of attention and loss
    short = tok("a b", add_special_tokens=False)["input_ids"]
    n = len(short) + len(tok("c d", add_special_tokens=False)["input_ids"]) + 1
    assert batch["attention_mask"][1].tolist() == [1] * n + [0] * (12 - n)
    assert batch["labels"][1, n:].eq(-100).all() and batch["labels"][1, : len(short)].eq(-100).all()
    assert int(batch["truncated"]) == 1
    inputs, targets = objective.split(batch)
    with torch.no_grad():
        ours = objective.loss(objective.forward(model, inputs), targets)
        reference = model(**inputs, labels=targets).loss  # transformers' own shifted, masked loss
    assert ours.item() == pytest.approx(reference.item(), rel=1e-5)
    joined_inputs, joined_targets = objective.join([(inputs, targets), objective.split(
        objective.collate(train=True)([{"prompt": "x", "answer": "y"}]))])
    assert joined_inputs["input_ids"].shape == (3, 12) and joined_targets[2].ne(-100).sum() == 2


def test_answer_logits_only_gives_the_same_loss_and_gradients_from_fewer_logits(model):
    """The LM head runs over the answer window only; loss and gradients equal the full path's,
    for a batch and for a replay-style join of two batches."""
    full = lm_objective(model, max_length=40, answer_logits_only=False)
    window = lm_objective(model, max_length=40, answer_logits_only=True)
    records = [{"prompt": "one two three four five six seven eight nine", "answer": "ten"},
               {"prompt": "a b", "answer": "c d e"}, {"prompt": "x y z w", "answer": "q"}]
    other = [{"prompt": "a much longer prompt than the others in this test by far", "answer": "r s"}]
    batch = full.collate(train=True)(records)
    cases = [(full.split(batch), window.split(batch))]
    part = full.collate(train=True)(other)
    cases.append((full.join([full.split(batch), full.split(part)]),
                  window.join([window.split(batch), window.split(part)])))
    for (inputs, labels), (w_inputs, w_labels) in cases:
        start, end = answer_window(w_labels)
        assert (labels[:, 1:] != -100).any(0).nonzero().flatten().tolist()[0] == start
        assert end - start < labels.shape[1] - 1  # fewer positions than the full path's
        grads = []
        for objective, x, y in ((full, inputs, labels), (window, w_inputs, w_labels)):
            model.zero_grad()
            logits = objective.forward(model, x)
            loss = objective.loss(logits, y)
            loss.backward()
            grads.append((loss.item(), logits.shape[1],
                          [p.grad.clone() for p in model.parameters() if p.grad is not None]))
        (ref, n_full, g_full), (ours, n_window, g_window) = grads
        assert n_window == end - start < n_full
        assert ours == pytest.approx(ref, rel=1e-5)
        assert len(g_full) == len(g_window) and all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g_full, g_window))
    model.zero_grad()


@pytest.mark.parametrize("answered", [[], [0], [4], [1, 2], [0, 4], [2, 3, 4]])
def test_answer_window_spans_the_positions_that_predict_an_answer_token(answered):
    """The window read back in one transfer equals the one its definition gives: from the first
    to the last position whose next token is an answer token in some row; (0, 1) without one."""
    labels = torch.full((2, 6), -100)
    for i, t in enumerate(answered):
        labels[i % 2, t + 1] = 7
    predicting = (labels[:, 1:] != -100).any(0).nonzero().flatten().tolist()
    expected = (predicting[0], predicting[-1] + 1) if predicting else (0, 1)
    assert answer_window(labels) == expected
    assert answer_window(torch.full((2, 1), -100)) == (0, 1)  # one position: nothing to predict


def _step_gradients(objective, model, batch, bf16: bool = False) -> tuple[int, list[torch.Tensor]]:
    """One training step's logits width and the gradients of every parameter that takes one
    (``bf16``: the forward under CPU bf16 autocast, as a ``bf16-mixed`` run trains)."""
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        inputs, labels = objective.split(batch)
        logits = objective.forward(model, inputs)
        loss = objective.loss(logits, labels)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    return logits.shape[1], grads


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_answer_window_is_the_default_where_the_head_is_frozen_and_changes_no_bit_there(bf16):
    """By default the window is on exactly where the running model's LM head takes no gradient
    (a LoRA-style frozen base); there every gradient is bit-equal to the whole sequence's, in
    fp32 and under bf16 autocast (native on a CPU with bf16 units, emulated elsewhere). With the
    head trained, the default keeps the whole sequence (its weight gradient sums over
    positions); the decision follows the model called, not the one attached."""
    model = tiny_lm().train()
    records = [{"prompt": "one two three four five six seven eight nine", "answer": "ten"},
               {"prompt": "a b", "answer": "c d e"}, {"prompt": "x y z w", "answer": "q"}]
    default, whole = lm_objective(model, max_length=40), lm_objective(model, max_length=40, answer_logits_only=False)
    batch = default.collate(train=True)(records)
    width = batch["input_ids"].shape[1]
    assert _step_gradients(default, model, batch)[0] == width
    trained_copy = copy.deepcopy(model)
    model.hf.get_output_embeddings().weight.requires_grad_(False)
    (n_window, g_window), (n_whole, g_whole) = (_step_gradients(o, model, batch, bf16) for o in (default, whole))
    assert n_window < n_whole == width
    assert len(g_window) == len(g_whole) > 0 and all(torch.equal(a, b) for a, b in zip(g_window, g_whole))
    assert _step_gradients(default, trained_copy, batch)[0] == width  # attached model frozen, this one not
    forced = lm_objective(trained_copy, max_length=40, answer_logits_only=True)
    assert _step_gradients(forced, trained_copy, batch)[0] == n_window


def test_each_sample_cut_from_a_windowed_batch_keeps_its_own_window(model):
    """EWC's Fisher calls the loss on one sample at a time, cut from a split batch: the labels
    the inputs carry are cut with it, so each sample's logits and loss use its own window."""
    objective = lm_objective(model, max_length=40, answer_logits_only=True)
    whole = lm_objective(model, max_length=40, answer_logits_only=False)
    batch = objective.collate(train=True)([{"prompt": "a b c d e f g", "answer": "h"},
                                           {"prompt": "a", "answer": "b c d e"}])
    inputs, labels = objective.split(batch)
    with torch.no_grad():
        for i in range(2):
            one = {key: value[i:i + 1] for key, value in inputs.items()}
            start, end = answer_window(labels[i:i + 1])
            logits = objective.forward(model, one)
            assert logits.shape[1] == end - start
            reference = whole.loss(whole.forward(model, one), labels[i:i + 1])  # the whole sequence's logits
            assert objective.loss(logits, labels[i:i + 1]).item() == pytest.approx(reference.item(), rel=1e-5)


def test_batched_generation_from_left_padded_prompts_equals_one_prompt_at_a_time(model):
    from torchmetrics import MetricCollection

    objective = lm_objective(model, max_length=64, max_new_tokens=6, default_metric="exact_match")
    records = [{"prompt": "How many legs do 3 spiders have? Answer:", "answer": "24"},
               {"prompt": "Hi", "answer": "x"}]
    batch = objective.collate(train=False)(records)
    assert batch["attention_mask"][1, 0] == 0 and batch["attention_mask"][1, -1] == 1  # left padding
    together = objective.generate(model, batch["input_ids"], batch["attention_mask"], 6)
    alone = []
    for record in records:
        single = objective.collate(train=False)([record])
        alone += objective.generate(model, single["input_ids"], single["attention_mask"], 6)
    assert together == alone
    metrics = MetricCollection(objective.metrics(None))
    objective.evaluate(model, batch, metrics)
    objective.finish_evaluation(model)
    assert float(metrics.compute()["exact_match"]) == sum(p == r["answer"] for p, r in zip(together, records)) / 2


def test_a_pass_is_decoded_pooled_by_column_and_length_and_scored_in_the_order_it_came(model):
    """Batches of three columns (caps 2, 2 and 5) are decoded together after the pass: a batch
    holds rows of any cap, by column and length, each column prefilled apart (its shared
    instruction once), no row decoding past its cap, and each column's metric and saved rows
    get what decoding its loader batches one by one gives."""
    from torchmetrics import MetricCollection

    from unittest import mock

    from clbench.data.streams import Experience
    from clbench.objectives import greedy_loop
    from clbench.objectives.generation_pool import plan

    caps = {"a": 2, "b": 2, "c": 5}
    words = ["alpha", "beta gamma", "delta epsilon zeta eta", "theta", "iota kappa lambda", "mu nu xi omicron pi rho"]
    instruction = {"a": "a: say which word comes next.", "b": "b: name the next one in the list please.", "c": "c:"}
    records = {name: [{"prompt": f"{instruction[name]} " + " ".join(words[(i + k) % len(words)] for k in range(i % 4 + 1)),
                       "answer": "x"} for i in range(7)] for name in caps}
    columns = {name: Experience(position=i, name=name, domain_id=i, classes=[], train=[], test=records[name]) for i, name in enumerate(caps)}
    runs = {}
    for pooled in (True, False):
        objective = lm_objective(model, max_length=96, max_new_tokens=caps, generation_batch=4)
        collate = objective.collate(train=False)
        metrics = {name: MetricCollection(objective.metrics(columns[name])) for name in caps}
        objective.begin_evaluation()
        expected = {}
        for name, column in columns.items():
            for start in (0, 3, 6):  # loader batches of 3, 3 and 1
                batch = collate(records[name][start:start + 3])
                if pooled:
                    objective.evaluate(model, batch, metrics[name], column)
                else:
                    expected.setdefault(name, []).extend(
                        objective.generate(model, batch["input_ids"], batch["attention_mask"], caps[name]))
        if pooled:
            assert objective._generations == {}  # nothing is decoded before the pass ends
            parts, prefill = [], greedy_loop.prefill

            def spy(model_, rows, pad_id, prefix=None, shared=0):
                parts.append(([r[:shared].tolist() for r in rows], [len(r) for r in rows]))
                return prefill(model_, rows, pad_id, prefix, shared)

            with mock.patch.object(greedy_loop, "prefill", spy), decoding_steps(model) as steps:
                objective.finish_evaluation(model)
            runs["pooled"] = ({n: [r["prediction"] for r in rows] for n, rows in objective._generations.items()},
                              {n: float(m.compute()["exact_match"]) for n, m in metrics.items()},
                              objective.summary()["generation_rows"])
        else:
            runs["alone"] = expected
    predictions, scores, rows = runs["pooled"]
    assert predictions == runs["alone"]
    assert scores == {n: sum(p == "x" for p in predictions[n]) / 7 for n in caps}
    assert rows == 4
    tok = model.tokenizer
    # 21 rows by column and length in six batches of 3-4; every part's rows share their column's
    # instruction (a and b, whose instructions are worth prefilling once) or nothing (c's tag)
    assert sum(len(lengths) for _, lengths in parts) == 21
    prefixes = {name: tok(instruction[name], add_special_tokens=False)["input_ids"] for name in caps}
    shared_by = [next((n for n in "ab" if p and p[0] == prefixes[n][:len(p[0])]), None) for p, _ in parts]
    assert {n for n in shared_by if n} == {"a", "b"} and all(len(set(map(tuple, p))) == 1 for p, _ in parts if p)
    assert all(lengths == sorted(lengths) for _, lengths in parts)
    # one decoding loop a batch, no row past its cap: batches holding a row of c decode 4 more
    # steps after the first token, the others at most one; finished rows leave the batch
    assert max(steps) <= 4 and len(steps) <= 6 * 4
    # the generate path (static cache, hooked models) still plans batches of one cap
    lengths = [len(tok(r["prompt"], add_special_tokens=False)["input_ids"]) for n in caps for r in records[n]]
    groups = [caps[n] for n in caps for _ in records[n]]
    batches = plan(lengths, groups, 4)
    assert sorted(len(b) for b in batches) == [3, 3, 3, 4, 4, 4]
    assert all(len({groups[i] for i in b}) == 1 for b in batches)
    cap2 = [i for b in batches if groups[b[0]] == 2 for i in b]
    assert [lengths[i] for i in cap2] == sorted(lengths[i] for i in range(14))


def test_the_greedy_loop_stops_each_row_at_its_cap_or_eos_and_drops_it(model):
    """Rows of caps 1, 3 and 6 in one batch get what ``generate`` gives each alone with its own
    cap; a row that stops leaves the batch (the decoding steps' rows only fall); a row whose
    greedy token is EOS stops there, the EOS kept."""
    from clbench.objectives.greedy_loop import greedy

    tok = model.tokenizer
    objective = lm_objective(model, max_length=64)
    prompts = ["one two three", "alpha beta gamma delta", "x y", "the list goes on and on"]
    rows = [torch.tensor(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    caps = [1, 3, 6, 6]
    alone = [model.generate(input_ids=r[None], attention_mask=torch.ones_like(r)[None], max_new_tokens=c,
                            do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)[0, len(r):]
             .tolist() for r, c in zip(rows, caps)]
    with decoding_steps(model) as steps:
        tokens = greedy(model, rows, caps, [0, 1, 2, 3], tok.pad_token_id, tok.eos_token_id)
    assert tokens == alone
    assert steps == [3, 3, 2, 2, 2]  # the cap-1 row never steps; the cap-3 row leaves after its third token
    # EOS: make the second row's first greedy token the EOS, by naming that token the EOS
    eos = alone[1][0]
    stopped = greedy(model, rows, caps, [0, 1, 2, 3], tok.pad_token_id, eos)
    assert stopped[1] == [eos] and all(eos not in t[:-1] for t in stopped)
    assert objective.decode_loop(model, rows, caps, [0, 1, 2, 3], [False] * 4) == objective._texts(alone, False)


def test_a_column_is_cut_into_length_buckets_where_padding_costs_more_than_a_forward():
    from clbench.objectives.greedy_loop import length_buckets

    assert length_buckets([5, 5, 6, 6], cost=32) == [4]  # 2 padded positions: one part
    assert length_buckets([3, 3, 3, 60, 60], cost=32) == [3, 5]  # 3 x 57 padded positions: two parts
    assert length_buckets([3, 3, 3, 60, 60], cost=1000) == [5]
    assert length_buckets([7], cost=0) == [1]


def test_a_generation_config_that_is_not_plain_argmax_decodes_with_generate(model):
    """A repetition penalty in the model's generation config is applied by ``generate``; the
    objective then decodes with it, not with its own loop, and gives its texts."""
    import copy

    from torchmetrics import MetricCollection

    from clbench.objectives.greedy_loop import loop_decodes

    assert loop_decodes(model)
    sliding = copy.deepcopy(model)
    sliding.hf.config.layer_types = ["sliding_attention"] + sliding.hf.config.layer_types[1:]
    sliding.hf.config.sliding_window = 8
    assert not loop_decodes(sliding)  # a cache that keeps a window only is not joined by left-padding
    penalised = copy.deepcopy(model)
    penalised.hf.generation_config.repetition_penalty = 5.0
    assert not loop_decodes(penalised)
    records = [{"prompt": f"word {i} word {i} word", "answer": "x"} for i in range(4)]
    texts = {}
    for name, m in (("plain", model), ("penalised", penalised)):
        objective = lm_objective(m, max_length=64, max_new_tokens=8)
        batch = objective.collate(train=False)(records)
        objective.evaluate(m, batch, MetricCollection(objective.metrics(None)))
        objective.finish_evaluation(m)
        texts[name] = [r["prediction"] for r in objective._generations["all"]]
        assert texts[name] == objective.generate(m, batch["input_ids"], batch["attention_mask"], 8)
    assert texts["plain"] != texts["penalised"]


def test_a_strategy_context_keeps_each_column_apart_and_wraps_its_decoding(model):
    """With the strategy's per-column context, rows of two columns of one cap are decoded in two
    batches, each inside its own column's context; ``pool_generation: false`` decodes a batch
    as it comes."""
    import contextlib

    from torchmetrics import MetricCollection

    from clbench.data.streams import Experience

    objective = lm_objective(model, max_length=64, max_new_tokens=3)
    columns = [Experience(position=i, name=n, domain_id=i, classes=[], train=[], test=[]) for i, n in enumerate("ab")]
    seen = []

    @contextlib.contextmanager
    def evaluating(column):
        seen.append(column.name)
        yield

    records = [{"prompt": f"question {i}", "answer": "x"} for i in range(3)]
    for column in columns:
        objective.evaluate(model, objective.collate(train=False)(records), MetricCollection(objective.metrics(column)),
                           column)
    objective.finish_evaluation(model, evaluating)
    assert seen == ["a", "b"] and set(objective._generations) == {"a", "b"}
    objective.begin_evaluation()
    for column in columns:
        objective.evaluate(model, objective.collate(train=False)(records), MetricCollection(objective.metrics(column)),
                           column)
    objective.finish_evaluation(model)  # no context: one batch for both columns
    assert objective._generation_rows == [6]
    # a batch the memory cannot hold is cut: room for two rows, so batches of 2 and 1, the same texts
    from unittest import mock

    from clbench.objectives import generation_pool

    longest = max(len(model.tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) for r in records)
    each = generation_pool.bytes_per_row(model.config, longest + 3, 4)
    pooled = [r["prediction"] for r in objective._generations["a"]]
    objective.begin_evaluation()
    objective.evaluate(model, objective.collate(train=False)(records), MetricCollection(objective.metrics(columns[0])),
                       columns[0])
    with mock.patch.object(generation_pool, "free_memory", return_value=int(2.5 * each / generation_pool.MEMORY_SHARE)):
        objective.finish_evaluation(model)
    assert objective._generation_rows == [2, 1]
    assert objective.summary()["generation_rows"] < objective.generation_batch
    assert [r["prediction"] for r in objective._generations["a"]] == pooled
    unpooled = lm_objective(model, max_length=64, max_new_tokens=3, pool_generation=False)
    unpooled.evaluate(model, unpooled.collate(train=False)(records), MetricCollection(unpooled.metrics(columns[0])),
                      columns[0])
    assert [r["prediction"] for r in unpooled._generations["a"]] == [r["prediction"] for r in objective._generations["a"]]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny random Llama whose tokenizer has a ChatML chat template, turns ending with <|im_end|> (its eos)."""
    from clbench.models.lm.fixtures import CHAT_TEMPLATE, sample_texts
    from clbench.models.lm.fixtures import tiny_config as lm_config
    from clbench.models.lm.causal_lm import hf_causal_lm
    from clbench.data.tokenizer import train_tiny_tokenizer
    from transformers import AutoTokenizer

    folder = train_tiny_tokenizer(sample_texts(), tmp_path_factory.mktemp("chat") / "tok", vocab_size=300)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "eos_token": "<|im_end|>"})
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    config = lm_config("llama", layers=1, hidden=32)
    return hf_causal_lm(architecture="llama", tokenizer=str(folder), config=config).eval()


def test_chat_template_wraps_prompts_and_keeps_the_loss_on_the_answer_and_its_end_of_turn(chat_model, model):
    from clbench.errors import UserError

    tok = chat_model.tokenizer
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    record = {"prompt": "Question: 2 + 3 = ?", "answer": "5"}
    head = "<|im_start|>user\nQuestion: 2 + 3 = ?<|im_end|>\n<|im_start|>assistant\n"
    objective = lm_objective(chat_model, max_length=64, chat_template=True)
    batch = objective.collate(train=True)([record])
    answer = ids("5") + [tok.eos_token_id]  # the turn's end is the eos: the newline after it is not trained
    assert batch["input_ids"][0].tolist() == ids(head) + answer
    assert batch["labels"][0].tolist() == [-100] * len(ids(head)) + answer
    test = objective.collate(train=False)([record])
    assert test["input_ids"][0].tolist() == ids(head) and test["prompts"] == [record["prompt"]]
    plain = lm_objective(chat_model, max_length=64).collate(train=True)([record])  # TRACE's way: as it is
    assert plain["input_ids"][0].tolist() == ids(record["prompt"]) + answer
    # a template whose turn end is not the eos: the eos follows the rendered turn
    tok.eos_token = "<eos>"
    try:
        batch = lm_objective(chat_model, max_length=64, chat_template=True).collate(train=True)([record])
        assert batch["labels"][0].tolist() == [-100] * len(ids(head)) + ids("5<|im_end|>\n") + [tok.eos_token_id]
    finally:
        tok.eos_token = "<|im_end|>"
    with pytest.raises(UserError, match="tokenizer has no chat template") as err:
        lm_objective(model, chat_template=True)  # the trace-mini tokenizer has none
    assert err.value.where == "objective.init_args.chat_template"
    with pytest.raises(UserError, match=r"objective\.init_args\.chat_template: expected bool, got str 'yes'"):
        lm_objective(chat_model, chat_template="yes")
    with pytest.raises(UserError, match=r"objective\.init_args\.max_length: max_length must be >= 2, got 1"):
        lm_objective(chat_model, max_length=1)


def test_trace_scoring_scores_the_generation_as_decoded_and_lenient_scoring_stripped(model):
    """TRACE's inference neither strips nor cleans up tokenization spaces; its exact match then
    compares raw strings. The untrained model's generations carry spaces, so the two differ."""
    from torchmetrics import MetricCollection

    tok = model.tokenizer
    records = [{"prompt": f"Question {i}: say A. Answer:", "answer": "A"} for i in range(6)]
    rows = {}
    for name in ("trace_exact_match", "exact_match"):
        objective = lm_objective(model, max_length=64, max_new_tokens=5, default_metric=name)
        batch = objective.collate(train=False)(records)
        metrics = MetricCollection(objective.metrics(None))
        objective.evaluate(model, batch, metrics)
        objective.finish_evaluation(model)
        rows[name] = objective._generations["all"]
        out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=5,
                             do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        raw = tok.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True,
                               clean_up_tokenization_spaces=False)
        expected = raw if name.startswith("trace") else [t.strip() for t in tok.batch_decode(
            out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)]
        assert [r["prediction"] for r in rows[name]] == expected
    assert any(r["prediction"] != r["prediction"].strip() for r in rows["trace_exact_match"])


def _lm_config(**overrides) -> dict:
    from clbench.config.load import resolve_config

    raw = tiny_config(benchmark={"class_path": "trace-mini",
                                 "init_args": {"tasks": ["FOMC", "NumGLUE-cm"], "n_train": 64, "n_test": 12}},
                      model={"class_path": "hf_causal_lm",
                             "init_args": {"architecture": "qwen3", "tokenizer": "trace-mini", "config": TINY_LM}},
                      objective={"class_path": "causal_lm", "init_args": {"max_length": 96, "max_new_tokens": 4}},
                      train={"epochs": 2, "batch_size": 16,
                             "optimizer": {"class_path": "adamw", "init_args": {"lr": 0.003}}})
    raw["model"]["init_args"].pop("hidden", None)
    return resolve_config({**raw, **overrides})


def test_a_trace_format_stream_runs_resumes_and_keeps_its_generations(tmp_path, monkeypatch):
    from clbench.engine.runner import run

    cfg = _lm_config()
    reference = run(cfg, tmp_path / "reference")
    assert reference["experiences"] == ["FOMC", "NumGLUE-cm"]
    assert reference["r_metric"] == {"names": ["trace_exact_match", "trace_exact_match"], "higher_is_better": True}
    assert reference["objective"]["scoring"] == "trace"
    assert reference["r_matrix"][0][0] > reference["r_init"][0]  # FOMC is learned
    saved = [json.loads(line) for line in (tmp_path / "reference" / "predictions" / "FOMC.jsonl").open()]
    assert len(saved) == 12 and set(saved[0]) == {"prompt", "answer", "prediction", "score"}
    assert sum(row["score"] for row in saved) / 12 == pytest.approx(reference["r_matrix"][-1][0])
    assert reference["objective"]["truncated_samples"] == {"train": 0, "test": 0}
    assert reference["objective"]["predictions"]["FOMC"] == "predictions/FOMC.jsonl"

    crash_at(monkeypatch, "stage:1:step:2", cfg, tmp_path / "crashed")
    resumed = run(cfg, tmp_path / "crashed", resume=True)
    assert resumed["r_matrix"] == reference["r_matrix"]
    assert (tmp_path / "crashed" / "predictions" / "NumGLUE-cm.jsonl").read_text() == \
        (tmp_path / "reference" / "predictions" / "NumGLUE-cm.jsonl").read_text()


def test_routing_units_are_the_unpadded_teacher_forced_tokens_with_their_compositions():
    """The evaluation's routing records count each test sample's prompt + answer tokens once
    (no padding, no decoding steps), labelled by position and frequency bucket."""
    from clbench.metrics import RoutingRecorder
    from clbench.objectives.causal_lm import CausalLanguageModeling
    from clbench.objectives.token_compositions import FREQUENCY_BUCKETS, POSITION_BUCKETS
    from clbench.data.streams import StreamSpec
    from clbench.strategies.moe_lora import LoRAMoE
    from lm_helpers import build, lm, stream

    experiences = stream(8)
    objective = CausalLanguageModeling(max_length=48, max_new_tokens=3)
    objective.setup(StreamSpec(name="t", objective="causal_lm"), experiences)
    model = lm()
    objective.attach(model)
    build(LoRAMoE(num_experts=2, top_k=1, r=2), experiences, model=model)  # injects the MoE adapters
    recorder = RoutingRecorder(num_domains=2, compositions=True).attach(model)
    batch = objective.collate(train=False)(experiences[1].test)
    assert (batch["attention_mask"] == 0).any()  # left padding in the prompts
    from torchmetrics import MetricCollection

    with recorder.domain(1):
        objective.evaluate(model, batch, MetricCollection(objective.metrics(experiences[1])), experiences[1])
    tokens = int(batch["forced_mask"].sum())
    assert tokens < batch["forced_mask"].numel()  # the forced sequences are padded too
    figures = recorder.compute()
    assert {float(f["units"][1]) for f in figures.values()} == {float(tokens)}
    comps = recorder.compositions([1])
    assert {c["units"] for c in comps.values()} == {tokens}
    assert all(1 <= c["compositions"] <= POSITION_BUCKETS * FREQUENCY_BUCKETS for c in comps.values())
    buckets = objective._buckets  # built by the first routing record, from the stream's training records
    assert buckets.shape[0] == len(objective.tokenizer) and int(buckets.max()) == FREQUENCY_BUCKETS - 1
    # the teacher-forced pass asks for one position's logits; with all of them the records are the same
    from unittest import mock

    full = RoutingRecorder(num_domains=2, compositions=True).attach(model)
    with mock.patch("clbench.objectives.causal_lm.keeps_logits", return_value=False), full.domain(1):
        objective.evaluate(model, batch, MetricCollection(objective.metrics(experiences[1])), experiences[1])
    assert str(full.compute()) == str(figures) and str(full.compositions([1])) == str(comps)


@pytest.mark.slow
def test_generation_under_ddp_scores_every_test_sample_once_and_keeps_them_all(tmp_path, write_yaml):
    """Two gloo processes each generate for their shard of 7 test prompts (not divisible by
    2): the untrained model's scores equal one process's, the saved generations hold every
    prompt once in dataset order, and the final R row is their mean score."""
    from clbench.engine.runner import run
    from helpers import run_cli

    odd = {"benchmark": {"class_path": "trace-mini",
                         "init_args": {"tasks": ["FOMC", "NumGLUE-cm"], "n_train": 8, "n_test": 7}},
           "train": {"epochs": 1, "batch_size": 8, "eval_batch_size": 4,
                     "optimizer": {"class_path": "adamw", "init_args": {"lr": 0.003}}}}
    single = run(_lm_config(**odd), tmp_path / "single")
    cfg = _lm_config(**odd, trainer={"accelerator": "cpu", "devices": 2, "strategy": "ddp"})
    proc = run_cli("run", "--config", str(write_yaml(cfg)), "--output", str(tmp_path / "ddp"), "--no-progress")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "ddp" / "result.json").read_text())
    assert result["r_init"] == single["r_init"]
    for j, task in enumerate(result["experiences"]):
        rows = [json.loads(line) for line in (tmp_path / "ddp" / "predictions" / f"{task}.jsonl").open()]
        alone = [json.loads(line) for line in (tmp_path / "single" / "predictions" / f"{task}.jsonl").open()]
        assert [r["prompt"] for r in rows] == [r["prompt"] for r in alone] and len(rows) == 7
        assert sum(r["score"] for r in rows) / 7 == pytest.approx(result["r_matrix"][-1][j], abs=1e-9)
