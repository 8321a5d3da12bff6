"""The static KV cache (``kv_cache: static``): sized in steps, filled from a shared prefix, and
decoding what the dynamic cache decodes on the CPU."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from helpers import lm_objective, tiny_lm


@pytest.fixture(scope="module")
def model():
    return tiny_lm()


def test_a_static_cache_is_allocated_in_steps_and_starts_after_a_prefix_written_into_it(model):
    from transformers import DynamicCache

    from clbench.objectives.kv_cache import STATIC_STEP, static_cache, static_length

    assert [static_length(n) for n in (1, STATIC_STEP, STATIC_STEP + 1)] == [STATIC_STEP, STATIC_STEP, 2 * STATIC_STEP]
    ids = torch.randint(5, 200, (3, 9), generator=torch.Generator().manual_seed(0))
    prefix = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids[:, :5], cache=prefix, use_cache=True)
    cache = static_cache(model, 9 + 4, filled=prefix)
    assert int(cache.get_seq_length()) == 5 and cache.layers[0].keys.shape[-2] == STATIC_STEP
    for static, dynamic in zip(cache.layers, prefix.layers):
        assert static.keys[:, :, :5].equal(dynamic.keys) and static.values[:, :, 5:].eq(0).all()
    # the rest of the prompt read after the prefix gives the logits of reading it whole
    with torch.no_grad():
        whole = model(input_ids=ids).logits[:, -1]
        after = model(input_ids=ids[:, 5:], cache=cache, use_cache=True).logits[:, -1]
    torch.testing.assert_close(after, whole, rtol=1e-5, atol=1e-5)


CAPS = {"a": 3, "b": 3, "c": 6}


def _pooled_pass(model, kv_cache: str) -> tuple[dict[str, list[str]], object]:
    """One evaluation pass over three columns, pooled: the texts per column, and the objective.
    Columns a and b share an instruction (a prefix cache is written first); c has another cap."""
    from torchmetrics import MetricCollection

    from clbench.data.streams import Experience

    words = ["one", "two", "three"]
    records = {name: [{"prompt": f"{name}: continue the list of words please. " + " ".join(words[:i % 3 + 1]),
                       "answer": "x"} for i in range(5)] for name in CAPS}
    objective = lm_objective(model, max_length=96, max_new_tokens=CAPS, generation_batch=4, kv_cache=kv_cache)
    objective.begin_evaluation()
    for position, name in enumerate(CAPS):
        column = Experience(position=position, name=name, domain_id=position, classes=[], train=[], test=records[name])
        objective.evaluate(model, objective.collate(train=False)(records[name]),
                           MetricCollection(objective.metrics(column)), column)
    objective.finish_evaluation(model)
    return {n: [r["prediction"] for r in rows] for n, rows in objective._generations.items()}, objective


def test_a_pooled_pass_decodes_the_same_texts_with_the_static_cache_on_the_cpu(model):
    """Every row's text equals the dynamic cache's, and every batch was decoded from a static
    cache holding its shared instruction."""
    from clbench.objectives import kv_cache

    made = []

    def spy(model_, positions, filled=None):
        made.append((kv_cache.static_cache(model_, positions, filled), filled is not None))
        return made[-1][0]

    with mock.patch("clbench.objectives.causal_lm.static_cache", spy):
        dynamic, _ = _pooled_pass(model, "dynamic")
        assert not made
        static, objective = _pooled_pass(model, "static")
    assert static == dynamic
    assert len(made) == len(objective._generation_rows) == 5  # 10 rows of cap 3 in 3 batches, 5 of cap 6 in 2
    assert all(type(c).__name__ == "StaticCache" for c, _ in made)
    assert all(prefixed for _, prefixed in made)  # each batch's shared instruction was written in first


def test_the_decoding_step_compiled_over_the_static_cache_decodes_the_same_texts(model):
    """What a GPU runs: transformers compiles the decoding step when handed a static cache (here
    forced on the CPU, where it does not by itself). Batches of 2-4 rows share compiled graphs."""
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    dynamic, _ = _pooled_pass(model, "dynamic")
    compiling = CompileConfig()
    compiling._compile_all_devices = True  # transformers compiles on accelerators only otherwise
    model.hf.generation_config.compile_config = compiling
    counters.clear()
    try:
        static, _ = _pooled_pass(model, "static")
    finally:
        model.hf.generation_config.compile_config = None
    assert static == dynamic
    assert 1 <= counters["stats"]["unique_graphs"] < 5  # compiled, and not once per batch


def test_a_model_whose_forward_hooks_change_its_input_decodes_with_the_dynamic_cache(model):
    """A forward pre-hook (as MoSEs' prompts are) may widen what a forward sees, so the static
    cache, sized from the prompt, is not used: no static cache is made, and the texts are the
    dynamic cache's."""
    dynamic, _ = _pooled_pass(model, "dynamic")
    handle = model.hf.model.layers[0].register_forward_pre_hook(lambda module, args: None)
    try:
        with mock.patch("clbench.objectives.causal_lm.static_cache") as spy:
            static, _ = _pooled_pass(model, "static")
    finally:
        handle.remove()
    assert not spy.called and static == dynamic


def test_an_unknown_cache_is_refused_with_the_field_named(model):
    from clbench.errors import UserError

    with pytest.raises(UserError, match="objective.init_args.kv_cache: expected one of 'dynamic', 'static'"):
        lm_objective(model, kv_cache="paged")
