"""MoSEs on a tiny random Qwen3: per-task masks, the straight-through estimator, the pull loss,
key matching on trace-mini tasks, the frozen base, and runs through the runner (keys mode, resume)."""

from __future__ import annotations

import pytest
import torch
from helpers import crash_at
from lm_helpers import build, lm, lm_config, train
from torch import nn

from clbench.benchmarks.trace_mini import generate
from clbench.models.layers.moses import (
    MoSELinear,
    TaskState,
    mose_layers,
    straight_through_mask,
)
from clbench.models import routing_channel as routing
from clbench.metrics.routing import RoutingRecorder
from clbench.data.streams import Experience
from clbench.strategies.lora import base_state
from clbench.strategies.moses import MoSEs, match, pull_loss, query


TASKS = ["FOMC", "NumGLUE-cm", "Py150"]


def trace_stream(tasks=TASKS, n_train=32, n_test=10) -> list[Experience]:
    data = generate(tasks, n_train=n_train, n_eval=0, n_test=n_test, seed=0)
    return [Experience(position=i, name=t, domain_id=i, classes=[], train=data[t]["train"], test=data[t]["test"])
            for i, t in enumerate(tasks)]


def masks(layer: MoSELinear, slot: int) -> torch.Tensor:
    return torch.cat([layer.mask_A[slot].flatten(), layer.mask_B[slot].flatten(), layer.mask_router[slot].flatten()])


def wsn_mask(scores: torch.Tensor, c: float) -> torch.Tensor:
    """Winning SubNetworks' GetSubnetFaster on |s| with sparsity 1 − c, restated: the entries at
    or above the k-th smallest |s|, k = 1 + round((1 − c)(n − 1))."""
    magnitudes = scores.abs().flatten()
    k = 1 + round(0.01 * float((1 - c) * 100) * (magnitudes.numel() - 1))
    return (scores.abs() >= magnitudes.kthvalue(k).values).float()


def test_masks_keep_the_largest_magnitudes_as_winning_subnetworks_does():
    from clbench.models.layers.moses import kept_count, top_c

    scores = torch.tensor([-0.9, 0.1, 0.2, -0.05])
    assert top_c(scores, 0.5).tolist() == [True, False, True, False]  # WSN's mask; signed ranking: [0, 1, 1, 0]
    assert [kept_count(n, c) for n, c in [(100, 0.3), (4, 0.5), (10, 0.03), (7, 1.0), (5, 0.0), (6, 0.5)]] \
        == [31, 2, 1, 7, 1, 4]  # 100 − round(69.3); 4 − round(1.5); 10 − round(8.73); ...; 6 − round(2.5) = 6 − 2
    generator = torch.Generator().manual_seed(0)
    for trial in range(200):
        n = int(torch.randint(2, 60, (1,), generator=generator))
        c = float(torch.rand((), generator=generator)) * 0.9 + 0.05
        s = torch.empty(n).uniform_(-1, 1, generator=generator)
        assert torch.equal(top_c(s, c).float(), wsn_mask(s, c)), (trial, n, c)


def test_straight_through_mask_keeps_top_c_and_passes_gradients_to_scores():
    torch.manual_seed(0)
    scores = torch.randn(4, 25, requires_grad=True)
    mask = straight_through_mask(scores, 0.3)
    assert mask.sum() == 31 and set(mask.unique().tolist()) == {0.0, 1.0}  # 100 − round(0.7 · 99)
    kept = mask.flatten().bool()
    assert scores.detach().abs().flatten()[kept].min() >= scores.detach().abs().flatten()[~kept].max()
    weight = torch.randn(4, 25)
    (weight * mask).sum().backward()
    # straight through to |s| (WSN): ∂L/∂s = ∂L/∂(θ⊙m) ⊙ θ ⊙ sign(s)
    torch.testing.assert_close(scores.grad, weight * scores.detach().sign())

    state = TaskState()
    layer = MoSELinear(nn.Linear(6, 5), state, num_tasks=2, num_experts=2, top_k=2, r=2, density=0.5)
    with torch.no_grad():
        layer.lora_B.normal_()
    state.training_slot = 0
    layer.train()(torch.randn(3, 6)).pow(2).sum().backward()
    assert all(getattr(layer, f"score_{n}").grad.abs().sum() > 0 for n in ("A", "B", "router"))
    assert layer.base_layer.weight.grad is None


def _two_task_layer(top_k: int = 1) -> tuple[TaskState, MoSELinear]:
    """A MoSE layer in eval mode with non-zero adapters and a stored mask for each of two tasks."""
    torch.manual_seed(1)
    state = TaskState()
    layer = MoSELinear(nn.Linear(6, 5), state, num_tasks=2, num_experts=2, top_k=top_k, r=2, density=0.4).eval()
    with torch.no_grad():
        layer.lora_B.normal_()
    for slot in (0, 1):
        layer.reset_scores()
        layer.store_mask(slot)
    return state, layer


def test_layer_uses_each_samples_stored_mask_and_no_adapter_before_any_task():
    state, layer = _two_task_layer()
    x = torch.randn(2, 4, 6)
    assert torch.equal(layer(x), layer.base_layer(x))  # state.slots is None
    state.slots = torch.tensor([0, 1])
    mixed = layer(x)
    for i, slot in enumerate((0, 1)):
        state.slots = torch.tensor([slot])
        torch.testing.assert_close(mixed[i:i + 1], layer(x[i:i + 1]))
    # a batch split across tasks records its routing once, in batch order: padding is left out
    # and every unit keeps its labels (its N_eff composition)
    recorder = RoutingRecorder(num_domains=1, compositions=True).attach(layer)
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    state.slots = torch.tensor([0, 1])
    with torch.no_grad(), recorder.domain(0), routing.units(token_mask=mask, token_labels=torch.arange(8).reshape(2, 4) % 3):
        layer(x)
    assert recorder.compute()["MoSELinear"]["units"].item() == 7
    figures = recorder.compositions()["MoSELinear"]
    assert figures["units"] == 7 and figures["compositions"] == 3 and "unlabelled" not in figures


def test_a_units_route_is_its_task_slot_then_its_experts():
    """With E2T2's top-2 of 2 every token uses both sub-experts; what tells two tasks' tokens apart
    is the task masks their keys chose, so each slot is its own route for N_eff."""
    state, layer = _two_task_layer(top_k=2)
    recorder = RoutingRecorder(num_domains=1, keep_routes=True, compositions=True).attach(layer)
    state.slots = torch.tensor([1, 0, 1])
    with torch.no_grad(), recorder.domain(0), routing.units(token_labels=torch.tensor([[0, 1]] * 3)):
        layer(torch.randn(3, 2, 6))
    _, routes = recorder.routes("MoSELinear")
    assert routes[:, 0].tolist() == [1, 1, 0, 0, 1, 1]  # each token's slot, in batch order
    assert routes[:, 1:].sort(-1).values.tolist() == [[0, 1]] * 6  # then both sub-experts
    figures = recorder.compositions()["MoSELinear"]
    assert figures["routes"] == 2 and figures["compositions"] == 2 and figures["n_eff"] == pytest.approx(2.0)


def test_stored_masks_apply_under_bf16_autocast():
    """precision: bf16-mixed (the TRACE configs' GPU setting) evaluates the fp32 adapter under
    autocast: the mixture comes out in bf16 and must still land in the per-sample delta."""
    state, layer = _two_task_layer()
    x = torch.randn(2, 4, 6)
    state.slots = torch.tensor([0, 1])
    full = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = layer(x)
    assert mixed.dtype == torch.bfloat16
    torch.testing.assert_close(mixed.float(), full, atol=0.05, rtol=0.05)


def test_pull_loss_on_a_hand_built_case():
    queries = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    key = torch.tensor([3.0, 3.0])
    # cosines 1/√2 and 1/√2: L = −1/√2
    torch.testing.assert_close(pull_loss(queries, key), torch.tensor(-(2 ** -0.5)))
    torch.testing.assert_close(pull_loss(torch.tensor([[1.0, 0.0]]), torch.tensor([-2.0, 0.0])), torch.tensor(1.0))
    assert match(torch.tensor([[1.0, 0.1], [-0.2, 1.0]]), torch.tensor([[0.0, 5.0], [2.0, 0.0]])).tolist() == [1, 0]


def test_without_protect_later_tasks_move_the_weights_an_earlier_task_selected():
    """protect=False (the paper's reading): masks overlap and nothing is restored, so training
    later tasks changes some of task 1's selected weights, which protect=True keeps exactly (the
    test below); the frozen base stays frozen either way."""
    experiences = trace_stream()
    model = lm()
    before = base_state(model)
    module = build(MoSEs(density=0.3, target_modules=["q_proj", "v_proj"], protect=False), experiences, model,
                   lr=0.02)
    layers = mose_layers(model)
    train(module, experiences[0], steps=4)
    kept = [{n: getattr(m, f"lora_{n}").detach()[getattr(m, f"mask_{n}")[0]].clone() for n in ("A", "B", "router")}
            for m in layers]
    for exp in experiences[1:]:
        train(module, exp, steps=4)
    moved = sum(not torch.equal(getattr(m, f"lora_{n}").detach()[getattr(m, f"mask_{n}")[0]], w[n])
                for m, w in zip(layers, kept) for n in ("A", "B", "router"))
    assert moved > 0
    after = base_state(model)
    assert all(torch.equal(after[k], v) for k, v in before.items())


def test_masks_are_per_task_base_is_frozen_and_keys_route_held_out_prompts():
    experiences = trace_stream()
    model = lm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    strategy = MoSEs(density=0.3, target_modules=["q_proj", "v_proj"])
    module = build(strategy, experiences, model, lr=0.02)
    layers = mose_layers(model)
    assert len(layers) == 4
    train(module, experiences[0], steps=4)
    first = [masks(m, 0).clone() for m in layers]
    weights = [{n: getattr(m, f"lora_{n}").detach().clone() for n in ("A", "B", "router")} for m in layers]
    for exp in experiences[1:]:
        train(module, exp, steps=4)
    assert strategy.slots == {"FOMC": 0, "NumGLUE-cm": 1, "Py150": 2}
    for m, mask, w in zip(layers, first, weights):
        assert torch.equal(masks(m, 0), mask) and not torch.equal(masks(m, 1), mask)
        assert abs(masks(m, 1).float().mean() - 0.3) < 0.02
        for n in ("A", "B", "router"):  # protect: task 1's selected weights are unchanged
            keep = getattr(m, f"mask_{n}")[0]
            assert torch.equal(getattr(m, f"lora_{n}")[keep], w[n][keep])
    after = base_state(model)
    assert all(torch.equal(after[k], v) for k, v in before.items())

    # Algorithm 2 on held-out prompts: each sample routes to the key nearest to q(x)
    tok = module.objective.tokenizer
    embed = model.hf.get_input_embeddings()
    correct = total = 0
    for exp in experiences:
        enc = tok([r["prompt"] for r in exp.test], return_tensors="pt", padding=True)
        decoder = model.hf.get_decoder()
        slots = strategy.choose_slots(decoder, enc["input_ids"], enc["attention_mask"])
        correct += int((slots == strategy.slots[exp.name]).sum())
        total += len(exp.test)
        assert query(embed, enc["input_ids"], enc["attention_mask"]).shape == (len(exp.test), 64)
    accuracy = correct / total
    print(f"key-routing accuracy on held-out prompts of {TASKS}: {accuracy:.2f}")
    assert strategy.identification(module)["accuracy"] == accuracy  # the diagnostic a run records
    assert accuracy >= 0.9


def test_prompt_prefix_changes_outputs_and_generation_runs_under_oracle_and_keys():
    experiences = trace_stream(TASKS[:2], n_train=16, n_test=4)
    for mode in ("oracle", "keys"):
        model = lm()
        strategy = MoSEs(task_inference=mode, prompt_length=2)
        module = build(strategy, experiences, model)
        initial = [strategy.prompts.prompt[0].detach().clone(), strategy.prompts.prompt[1].detach().clone()]
        train(module, experiences[0], steps=2)
        assert not torch.equal(strategy.prompts.prompt[0], initial[0])  # the task's prompt trains,
        assert torch.equal(strategy.prompts.prompt[1], initial[1])      # the other task's does not
        batch = module.objective.collate(train=False)(experiences[0].test)
        model.eval()
        module.objective.begin_evaluation()
        metrics = module.eval_metrics[0]
        module.objective.evaluate(model, batch, metrics, experiences[0])
        module.objective.finish_evaluation(model, lambda column: strategy.evaluating(module.context, column))
        assert strategy.state.slots.tolist() == [0] * 4  # only task 0 trained: every sample uses it
        # the prompt matters: changing it changes the logits
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        with torch.no_grad():
            a = model(**inputs).logits
            strategy.prompts.prompt[0].add_(1.0)
            b = model(**inputs).logits
        assert a.shape[1] == batch["input_ids"].shape[1] and not torch.allclose(a, b)


def test_runner_keys_mode_end_to_end_and_a_crashed_run_resumes_to_the_same_r(tmp_path, monkeypatch):
    from clbench.engine.runner import run

    cfg = lm_config({"class_path": "moses", "init_args": {"task_inference": "keys"}})
    reference = run(cfg, tmp_path / "reference")
    r = reference["r_matrix"]
    assert len(r) == 2 and all(len(row) == 2 for row in r)
    assert reference["expert_utilization"] and all(len(stage) == 4 for stage in reference["expert_utilization"])
    # task identification per stage: after the first task its key is the only one, so every
    # prompt routes to it; after the second, both tasks' test prompts are scored
    stages = reference["strategy"]["diagnostics"]["task_identification"]
    assert [sorted(stage["per_task"]) for stage in stages] == [["FOMC"], ["FOMC", "NumGLUE-cm"]]
    assert stages[0]["accuracy"] == 1.0 and 0.0 <= stages[1]["accuracy"] <= 1.0
    assert stages[1]["accuracy"] == sum(stages[1]["per_task"].values()) / 2  # 6 test prompts each

    crash_at(monkeypatch, "stage:1:step:2", cfg, tmp_path / "crashed")
    saved = torch.load(tmp_path / "crashed" / "checkpoint.pt", weights_only=True)
    assert saved["state"]["stage"] == 1 and list(saved["strategy"]["slots"].values()) == [0]
    assert any(k.endswith("q_proj.mask_A") for k in saved["model"])
    resumed = run(cfg, tmp_path / "crashed", resume=True)
    assert resumed["r_matrix"] == r
    assert resumed["strategy"]["diagnostics"] == reference["strategy"]["diagnostics"]


def test_oracle_mode_uses_the_column_the_module_evaluates():
    """The module evaluates each test column inside the strategy's ``evaluating`` context: under
    ``oracle`` every sample of a column uses that column's task, whatever the keys say."""
    experiences = trace_stream(TASKS[:2], n_train=16, n_test=4)
    model = lm()
    strategy = MoSEs(task_inference="oracle")
    module = build(strategy, experiences, model)
    for exp in experiences:
        train(module, exp, steps=1)
    model.eval()
    for slot, column in enumerate(experiences):
        batch = module.objective.collate(train=False)(experiences[0].test)  # task 0's prompts in both columns
        module.objective.begin_evaluation()
        with strategy.evaluating(module.context, column):
            module.objective.evaluate(model, batch, module.eval_metrics[0], column)
        module.objective.finish_evaluation(model, lambda c: strategy.evaluating(module.context, c))
        assert strategy.state.slots.tolist() == [slot] * 4


def test_every_prompted_layer_has_its_own_prompt_and_cached_generation_keeps_them():
    """Eq. 6: each prompted layer's input is [e_t^l; x^l]. A deeper layer's prompt changes the
    outputs; KV-cached greedy decoding (the prefix only in the first forward) equals decoding
    that recomputes the whole prompted sequence at every step."""
    experiences = trace_stream(TASKS[:1], n_train=16, n_test=4)
    model = lm()
    strategy = MoSEs(task_inference="oracle", prompt_length=2)
    module = build(strategy, experiences, model)
    from clbench.strategies.lora import lora_target

    layers = len(lora_target(model).get_decoder().layers)
    assert layers >= 2 and strategy.prompts.prompt[0].shape[0] == layers  # embeddings + each layer above the first
    train(module, experiences[0], steps=1)
    model.eval()
    batch = module.objective.collate(train=False)(experiences[0].test)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad(), strategy.evaluating(module.context, experiences[0]):
        before = model(**inputs).logits
        strategy.prompts.prompt[0][1].add_(1.0)  # the second layer's prompt only
        after = model(**inputs).logits
        tok = module.objective.tokenizer
        outs = [model.generate(**inputs, max_new_tokens=4, do_sample=False, use_cache=cache,
                               pad_token_id=tok.pad_token_id, eos_token_id=None) for cache in (True, False)]
    assert not torch.allclose(before, after)
    assert torch.equal(outs[0], outs[1])


def test_shallow_prompts_keep_one_prefix_at_the_input():
    experiences = trace_stream(TASKS[:1], n_train=8, n_test=2)
    strategy = MoSEs(prompt_length=1, deep_prompts=False)
    build(strategy, experiences, lm())
    assert strategy.prompts.prompt[0].shape[0] == 1


def test_kv_cache_static_decodes_as_the_dynamic_cache_under_moses_prompts():
    """MoSEs prepends its prompts in a forward hook (more positions than the prompt, a wider mask),
    which a static cache sized from the prompt cannot hold: ``kv_cache: static`` then decodes
    with the dynamic cache, to the same texts, past a 64-position allocation step."""
    experiences = trace_stream(TASKS[:1], n_train=16, n_test=4)
    texts = {}
    for kind in ("dynamic", "static"):
        model = lm()
        strategy = MoSEs(task_inference="oracle", prompt_length=2)
        module = build(strategy, experiences, model)
        train(module, experiences[0], steps=1)
        model.eval()
        module.objective.kv_cache, module.objective.max_new_tokens = kind, 70
        module.objective.begin_evaluation()
        module.objective.evaluate(model, module.objective.collate(train=False)(experiences[0].test),
                                  module.eval_metrics[0], experiences[0])
        module.objective.finish_evaluation(model, lambda column: strategy.evaluating(module.context, column))
        texts[kind] = [row["prediction"] for row in module.objective._generations[experiences[0].name]]
    assert texts["static"] == texts["dynamic"] and len(texts["static"]) == 4
