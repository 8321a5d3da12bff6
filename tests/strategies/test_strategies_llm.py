"""The language-model baselines: seq_ft, seq_lora and O-LoRA on a tiny random Qwen3, EWC and GEM
with only LoRA parameters trainable and dict (text) batches, and resumes through the runner."""

from __future__ import annotations

import io
import json

import pytest
import torch
from helpers import crash_at
from lm_helpers import build, factory, lm, lm_config, logits, stream, train, trainable

from clbench.errors import UserError
from clbench.strategies.lora import (
    SeqLoRA,
    activate,
    adapter_names,
    add_adapter,
    base_state,
    lora_config,
    lora_layers,
)
from clbench.strategies.o_lora import OLoRA, l2_loss, orthogonality_loss


# -- seq_ft and seq_lora ---------------------------------------------------------------------
def test_seq_ft_is_naive_under_its_llm_name():
    from clbench import registry
    from clbench.strategies.naive import Naive

    cls = registry.resolve("strategies", "seq_ft", where="test")
    assert issubclass(cls, Naive) and cls.supports_sharded and cls().hparams() == {}


def test_seq_lora_trains_only_the_adapter_and_leaves_the_base_bit_identical():
    experiences = stream()
    model = lm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    module = build(SeqLoRA(r=4), experiences, model)
    names = trainable(model)
    # q_proj (64 -> 64) and v_proj (64 -> 32) in both layers: r·in + out·r each.
    assert names and all(".lora_A.default." in n or ".lora_B.default." in n for n in names)
    assert sum(p.numel() for p in names.values()) == 2 * (4 * 64 + 64 * 4 + 4 * 64 + 32 * 4)
    assert sum(p.numel() for p in names.values()) < 0.01 * sum(p.numel() for p in model.parameters())
    for exp in experiences:
        train(module, exp)
    after = base_state(model)
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert all(p.abs().sum() > 0 for n, p in names.items() if "lora_B" in n)  # the adapter trained (B starts at 0)


def test_seq_lora_options_reach_peft_and_bad_ones_are_refused():
    module = build(SeqLoRA(r=2, alpha=6.0, dropout=0.0, target_modules=["k_proj"], layers=[1]), stream())
    layers = lora_layers(module.model)
    assert len(layers) == 1 and layers[0] is module.model.hf.model.layers[1].self_attn.k_proj
    assert layers[0].scaling["default"] == 3.0 and layers[0].r["default"] == 2
    from clbench.models.layers.adapted import adapter_scales

    assert adapter_scales(module.model) == [3.0]  # what results record as model.adapter_scales
    from clbench.plugins.build import check_init_args

    for kwargs, field in [({"r": 0}, "r"), ({"alpha": 0}, "alpha"), ({"dropout": 1.0}, "dropout"),
                          ({"target_modules": "q_proj"}, "target_modules"), ({"target_modules": []}, "target_modules"),
                          ({"layers": [-1]}, "layers[0]"), ({"layers": []}, "layers")]:
        for cls in (SeqLoRA, OLoRA):
            with pytest.raises(UserError) as err:
                check_init_args(cls, kwargs, "strategy.init_args")
            assert err.value.where == f"strategy.init_args.{field}"
    with pytest.raises(UserError, match="cannot add LoRA adapters"):
        build(SeqLoRA(target_modules=["no_such_proj"]), stream())
    model = lm()  # a builder's adapter already there: two adapters would silently run one
    add_adapter(model, lora_config(4, 8, 0.0, ["q_proj"], None), "default")
    with pytest.raises(UserError, match="already has LoRA adapters") as err:
        build(OLoRA(), stream(), model)
    assert err.value.where == "model.init_args.lora"


# -- O-LoRA ----------------------------------------------------------------------------------
def test_orthogonality_loss_equals_a_hand_computation():
    model = lm()
    config = lora_config(2, 4, 0.0, ["q_proj"], [0])
    for name in ("task0", "task1", "task2"):
        add_adapter(model, config, name)
    (layer,) = lora_layers(model)
    a = {name: torch.zeros(2, 64) for name in ("task0", "task1", "task2")}
    a["task0"][0, 0], a["task0"][1, 1] = 1.0, 1.0                  # e0, e1
    a["task1"][0, 0], a["task1"][1, 2] = 3.0, 1.0                  # 3·e0, e2
    a["task2"][0, 0], a["task2"][0, 1], a["task2"][1, 2] = 1.0, 1.0, 2.0  # e0 + e1, 2·e2
    with torch.no_grad():
        for name, value in a.items():
            layer.lora_A[name].weight.copy_(value)
    # A0 A2ᵀ = [[1, 0], [1, 0]] -> 2;  A1 A2ᵀ = [[3, 0], [0, 2]] -> 9 + 4 = 13.
    assert orthogonality_loss(model, "task2", ["task0"]).item() == pytest.approx(2.0)
    assert orthogonality_loss(model, "task2", ["task0", "task1"]).item() == pytest.approx(15.0)
    assert orthogonality_loss(model, "task0", []).item() == 0.0
    # λ2's term: ‖A2‖ + ‖B2‖ (B starts at zero) = sqrt(1 + 1 + 4).
    assert l2_loss(model, "task2").item() == pytest.approx(6 ** 0.5)


def test_o_lora_keeps_earlier_adapters_frozen_and_still_adding_their_outputs():
    experiences = stream()
    model = lm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    strategy = OLoRA(r=4, dropout=0.0)
    module = build(strategy, experiences, model)
    train(module, experiences[0])
    first = {k: v.clone() for k, v in model.state_dict().items() if ".task0." in k}
    assert first and any(v.abs().sum() > 0 for k, v in first.items() if "lora_B" in k)
    train(module, experiences[1])
    assert adapter_names(model) == ["task0", "task1"]
    assert all(".task1." in n for n in trainable(model))
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in first.items())  # task 1's LoRA unchanged by task 2
    after = base_state(model)
    assert all(torch.equal(after[k], before[k]) for k in before)
    both = logits(module, experiences[0])
    activate(model, ["task1"], trainable=["task1"])
    alone = logits(module, experiences[0])
    assert not torch.allclose(both, alone)  # task 1's LoRA is still part of the model


def test_o_lora_terms_reach_the_gradient_of_the_current_a():
    experiences = stream()
    strategy = OLoRA(r=4, dropout=0.0, lambda_1=0.0)
    module = build(strategy, experiences)
    train(module, experiences[0], steps=2)
    strategy.adapt_model(module.context, experiences[1].position + 1)
    strategy.before_experience(module.context, experiences[1])
    model = module.model
    batch = module.objective.collate(train=True)(experiences[1].train[:4])
    inputs, targets = module.objective.split(batch)

    def grads(lambda_1: float, lambda_2: float) -> dict[str, torch.Tensor]:
        strategy.lambda_1, strategy.lambda_2 = lambda_1, lambda_2
        task = module.objective.loss(module.objective.forward(model, inputs), targets)
        loss = strategy.training_loss(module.context, inputs, targets, None, task)
        return dict(zip(trainable(model), torch.autograd.grad(loss, list(trainable(model).values()))))

    model.train()
    plain, ortho, l2 = grads(0.0, 0.0), grads(0.5, 0.0), grads(0.0, 0.1)
    for layer in lora_layers(model):
        a_t, a_0 = layer.lora_A["task1"].weight, layer.lora_A["task0"].weight
        name = next(n for n, p in trainable(model).items() if p is a_t)
        # d/dA_t ‖A_0 A_tᵀ‖² = 2 A_t A_0ᵀ A_0
        torch.testing.assert_close(ortho[name] - plain[name], 0.5 * 2 * a_t.detach() @ a_0.T @ a_0)
        torch.testing.assert_close(l2[name] - plain[name], 0.1 * a_t.detach() / a_t.detach().norm(),
                                   atol=1e-6, rtol=1e-4)
    assert all(".task1." in n for n in plain)  # task 0's LoRA gets no gradient


def test_o_lora_adapt_model_recreates_every_task_adapter_on_resume():
    experiences = stream()
    strategy = OLoRA(r=4)
    module = build(strategy, experiences)
    for exp in experiences:
        train(module, exp, steps=2)
    buffer = io.BytesIO()
    torch.save(strategy.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    fresh = OLoRA(r=4)
    rebuilt = build(fresh, experiences)
    fresh.load_state_dict(state)
    fresh.adapt_model(rebuilt.context, len(experiences))  # as a resume after both experiences
    rebuilt.model.load_state_dict(module.model.state_dict())  # strict: same keys and shapes
    assert adapter_names(rebuilt.model) == ["task0", "task1"] and not trainable(rebuilt.model)
    torch.testing.assert_close(logits(rebuilt, experiences[0]), logits(module, experiences[0]))
    fresh.adapt_model(rebuilt.context, len(experiences) + 1)  # the next experience trains a third LoRA only
    fresh.before_experience(rebuilt.context, experiences[1])
    assert adapter_names(rebuilt.model) == ["task0", "task1", "task2"]
    assert trainable(rebuilt.model) and all(".task2." in n for n in trainable(rebuilt.model))


# -- EWC and GEM on LoRA ---------------------------------------------------------------------
def lora_model():
    model = lm()
    add_adapter(model, lora_config(4, 8, 0.0, ["q_proj", "v_proj"], None), "default")
    with torch.no_grad():  # B = 0 would give A no gradient at all
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    return model


def test_ewc_on_lora_estimates_and_penalises_only_the_adapter():
    from clbench.strategies.ewc import EWC

    experiences = stream(6)
    strategy = EWC(ewc_lambda=2.0)
    module = build(strategy, experiences, lora_model())
    model = module.model
    strategy.after_experience(module.context, experiences[0])
    lora = trainable(model)
    assert set(strategy.importance) == set(lora) and all("lora_" in n for n in lora)
    # The Fisher is the mean squared per-sample gradient, one sample at a time.
    name = next(iter(lora))
    expected = torch.zeros_like(lora[name])
    model.eval()
    for record in experiences[0].train:
        inputs, targets = module.objective.split(module.objective.collate(train=True)([record]))
        loss = module.objective.loss_of(model, inputs, targets)
        expected += torch.autograd.grad(loss, [lora[name]])[0].pow(2)
    torch.testing.assert_close(strategy.importance[name], expected / 6, rtol=1e-4, atol=1e-9)
    with torch.no_grad():
        for p in lora.values():
            p.add_(0.01)
    penalty = strategy.training_loss(module.context, None, None, None, torch.zeros(()))
    assert penalty > 0
    params = list(model.parameters())
    grads = torch.autograd.grad(penalty, [p for p in params if p.requires_grad])
    assert all(g.abs().sum() > 0 for g in grads)
    assert sum(p.numel() for p in strategy.importance.values()) == sum(p.numel() for p in lora.values())


def test_gem_on_lora_projects_adapter_gradients_of_text_batches():
    from clbench.strategies.gem import GEM

    experiences = stream(8)
    strategy = GEM(patterns_per_experience=4, memory_strength=0.0, memory_batch_size=3)
    module = build(strategy, experiences, lora_model())
    model = module.model
    strategy.after_experience(module.context, experiences[0])
    strategy.adapt_model(module.context, experiences[1].position + 1)
    strategy.before_experience(module.context, experiences[1])
    strategy.train_loader(module.context, experiences[1].train, factory(module))
    assert len(strategy._chunks) == 1 and isinstance(strategy._chunks[0][0][0], dict)
    lora = list(trainable(model).values())
    model.train()
    memory = [experiences[0].train[i] for i in strategy.memory[:, 1].tolist()]
    inputs, targets = module.objective.split(module.objective.collate(train=True)(memory[:3]))
    rest = module.objective.split(module.objective.collate(train=True)(memory[3:]))
    reference = [g1 * 3 / 4 + g2 / 4 for g1, g2 in zip(
        torch.autograd.grad(module.objective.loss_of(model, inputs, targets), lora),
        torch.autograd.grad(module.objective.loss_of(model, *rest), lora))]
    reference = torch.cat([g.flatten() for g in reference])
    for p, r in zip(lora, torch.split(-reference, [p.numel() for p in lora])):  # a conflicting gradient
        p.grad = r.view_as(p) + 0.01 * torch.randn_like(p)
    strategy.before_optimizer_step(module.context, None)
    after = torch.cat([p.grad.flatten() for p in lora])
    assert strategy.projections == 1
    assert abs(float(after @ reference)) < 1e-4 * float(reference @ reference)  # on the constraint's boundary
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)


# -- through the runner ----------------------------------------------------------------------
@pytest.mark.parametrize("strategy", [{"class_path": "seq_lora", "init_args": {"r": 4}},
                                      {"class_path": "o_lora", "init_args": {"r": 4}},
                                      {"class_path": "gem", "init_args": {"patterns_per_experience": 6}}],
                         ids=lambda s: s["class_path"])
def test_a_crashed_lm_run_resumes_to_the_same_generations(strategy, tmp_path, monkeypatch):
    from clbench.engine.runner import run

    cfg = lm_config(strategy)
    reference = run(cfg, tmp_path / "reference")
    model = reference["model"]
    if strategy["class_path"] != "gem":
        assert model["params_trainable"] < 0.02 * model["params_total"]  # the adapter of one task
    crash_at(monkeypatch, "stage:1:step:2", cfg, tmp_path / "crashed")
    saved = torch.load(tmp_path / "crashed" / "checkpoint.pt", weights_only=True)
    assert saved["state"]["stage"] == 1
    if strategy["class_path"] != "gem":
        assert any("lora_A" in k for k in saved["model"])
    resumed = run(cfg, tmp_path / "crashed", resume=True)
    assert resumed["r_matrix"] == reference["r_matrix"]
    for task in ("FOMC", "NumGLUE-cm"):
        path = f"predictions/{task}.jsonl"
        assert (tmp_path / "crashed" / path).read_text() == (tmp_path / "reference" / path).read_text()
        assert all(json.loads(line)["prediction"] is not None for line in (tmp_path / "reference" / path).open())
