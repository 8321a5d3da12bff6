"""Mixture-of-LoRA-experts layers (LoRAMoE, MH-MoE) on a tiny random Qwen3: the layer against a
per-token loop, gating and router gradients, budgets, frozen bases, routing records and resume."""

from __future__ import annotations

import pytest
import torch
from helpers import crash_at
from lm_helpers import build, lm, lm_config, stream, train, trainable
from torch import nn

from clbench.errors import UserError
from clbench.models.layers.moe_lora import (
    MoELoRALinear,
    inject,
    moe_layers,
    param_counts,
    rank_for_budget,
)
from clbench.metrics.routing import RoutingRecorder
from clbench.strategies.lora import base_state
from clbench.strategies.moe_lora import LoRAMoE, MHMoE


def layer(kind="mh_moe", d_in=12, d_out=5, seed=0, **kw) -> MoELoRALinear:
    torch.manual_seed(seed)
    out = MoELoRALinear(nn.Linear(d_in, d_out), kind=kind, **kw)
    with torch.no_grad():
        out.lora_B.normal_()  # B = 0 would make every expert output 0
    return out


def loop_reference(m: MoELoRALinear, x: torch.Tensor) -> torch.Tensor:
    """Algorithm 1 token by token, head by head, expert by expert."""
    out = m.base_layer(x).clone()
    dh = m.in_features // m.heads
    for t in range(x.shape[0]):
        for h in range(m.heads):
            xh = x[t, h * dh:(h + 1) * dh]
            logits = m.lora_router[h] @ xh
            probs = logits.softmax(-1)
            if m.top_k is None:
                chosen, weights = range(m.experts_per_head), probs
            else:
                chosen = logits.topk(m.top_k).indices.tolist()
                renorm = logits[chosen].softmax(-1)
                weights = {j: (probs[j] if m.top_k == 1 and m.top1_gate == "probability" else renorm[i])
                           for i, j in enumerate(chosen)}
            for j in chosen:
                out[t] += weights[j] * ((m.lora_A[h, j] @ xh) @ m.lora_B[h, j]) * m.scaling
    return out


@pytest.mark.parametrize("kw", [{"kind": "mh_moe", "heads": 3, "num_experts": 4, "top_k": 1},
                                {"kind": "mh_moe", "heads": 2, "num_experts": 4, "top_k": 2},
                                {"kind": "mh_moe", "heads": 4, "num_experts": 3, "top_k": 1,
                                 "top1_gate": "renormalized"},
                                {"kind": "loramoe", "num_experts": 5, "top_k": 2},
                                {"kind": "loramoe", "num_experts": 4, "top_k": None}], ids=str)
def test_batched_dispatch_equals_the_per_token_loop(kw):
    m = layer(r=3, alpha=6.0, **kw)
    x = torch.randn(7, 12)
    with torch.no_grad():
        torch.testing.assert_close(m(x.view(1, 7, 12)).view(7, 5), loop_reference(m, x))


def test_mh_moe_with_one_head_computes_what_loramoe_top_k_computes():
    for top_k in (1, 2):
        a = layer("mh_moe", heads=1, num_experts=4, top_k=top_k, r=2, seed=1)
        b = layer("loramoe", num_experts=4, top_k=top_k, r=2, seed=2)
        b.load_state_dict(a.state_dict())
        x = torch.randn(2, 6, 12)
        assert torch.equal(a(x), b(x))
    # and heads matter: 3 heads on the same input route and compute differently
    c = layer("mh_moe", heads=3, num_experts=4, top_k=1, r=2)
    assert c(x).shape == a(x).shape and not torch.allclose(c(x), a(x))


def test_top1_router_gradient_follows_the_documented_choice():
    x = torch.randn(16, 12)
    for gate, learns in (("probability", True), ("renormalized", False)):
        m = layer(heads=3, num_experts=4, top_k=1, r=2, top1_gate=gate)
        m(x).pow(2).sum().backward()
        assert (m.lora_router.grad.abs().sum() > 0) == learns, gate
        assert m.lora_A.grad.abs().sum() > 0 and m.base_layer.weight.grad is None


def test_parameter_counts_and_rank_for_a_budget():
    m = layer(heads=4, num_experts=4, top_k=1, r=2, d_in=64, d_out=128)
    trainable_n = sum(p.numel() for p in m.parameters() if p.requires_grad)
    assert m.param_counts() == {"total": trainable_n, "active": 4 * 2 * (16 + 128) + 4 * 64}
    assert param_counts(64, 128, kind="loramoe", num_experts=4, top_k=None, r=2)["active"] == 4 * 2 * 192 + 256
    # one rank-8 LoRA on gate/up (64 -> 128) and down (128 -> 64) per layer: 3 · 8 · 192 = 4608
    shapes = [(64, 128), (64, 128), (128, 64)]
    assert rank_for_budget(4608, shapes, kind="lora", num_experts=1, top_k=1) == 8
    assert rank_for_budget(4608, shapes, kind="loramoe", num_experts=4, top_k=1) == 6    # 4480
    assert rank_for_budget(4608, shapes, kind="mh_moe", num_experts=4, top_k=1, heads=4) == 2  # 4096


@pytest.mark.parametrize("cls,kw,rank", [(LoRAMoE, {}, 6), (MHMoE, {"heads": 4}, 2)], ids=["loramoe", "mh_moe"])
def test_strategy_freezes_the_base_matches_the_budget_and_trains(cls, kw, rank):
    experiences = stream(8)
    model = lm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    strategy = cls(match_lora_rank=8, **kw)
    module = build(strategy, experiences, model)
    layers = moe_layers(model)
    assert len(layers) == 6 and {m.r for m in layers} == {rank}  # 2 transformer layers × 3 MLP linears
    names = trainable(model)
    assert all("lora_" in n for n in names)
    assert sum(p.numel() for p in names.values()) == strategy.total_params
    assert strategy.active_params == 2 * sum(m.param_counts()["active"] for m in layers[:3])
    assert abs(strategy.active_params - 2 * 4608) <= 0.15 * 2 * 4608
    assert strategy.diagnostics()["active_params"] == strategy.active_params
    for exp in experiences:
        train(module, exp, steps=2)
    after = base_state(model)
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert all(m.lora_B.abs().sum() > 0 for m in layers)  # experts trained (B starts at 0)


@pytest.mark.parametrize("cls,kw,rank", [(LoRAMoE, {}, 6), (MHMoE, {"heads": 4}, 2)], ids=["loramoe", "mh_moe"])
def test_scale_sets_alpha_from_the_matched_rank_and_results_record_it(cls, kw, rank):
    from clbench.models.layers.adapted import adapter_scales

    model = lm()
    strategy = cls(match_lora_rank=8, scale=2.0, **kw)
    build(strategy, stream(4), model)
    assert strategy.r == rank and strategy.alpha == 2.0 * rank and strategy.hparams()["alpha"] == 2.0 * rank
    assert {m.scaling for m in moe_layers(model)} == {2.0} and adapter_scales(model) == [2.0]
    strategy.load_state_dict({"r": 3})  # a resumed run: α follows the restored rank
    assert strategy.alpha == 6.0
    fixed = cls(match_lora_rank=8, alpha=16.0, **kw)
    build(fixed, stream(4), lm())
    assert fixed.alpha == 16.0  # without scale, α stays as given and α/r follows the rank


def test_routing_records_per_layer_and_heads_as_route_tuples():
    model = lm()
    inject(model.hf, ["up_proj"], [1], kind="mh_moe", heads=4, num_experts=4, top_k=1, r=2)
    (m,) = moe_layers(model)
    recorder = RoutingRecorder(num_domains=1, keep_routes=True).attach(model)
    ids = torch.randint(0, 50, (2, 9))
    with recorder.domain(0), torch.no_grad():
        model(input_ids=ids)
    figures = recorder.compute()
    (name,) = figures
    assert name.endswith("layers.1.mlp.up_proj") and m.num_experts == 16
    assert figures[name]["utilization"].shape == (1, 16)
    _, routes = recorder.routes(name)
    assert routes.shape == (18, 4)  # one expert per head: the tuple (S_1, …, S_4)
    assert all(((routes[:, h] >= 4 * h) & (routes[:, h] < 4 * h + 4)).all() for h in range(4))


def test_balance_term_reaches_the_loss_and_bad_options_are_refused():
    from clbench.models import auxiliary

    m = layer("loramoe", num_experts=4, top_k=None, r=2, balance_weight=0.5)
    with auxiliary.collect() as terms:
        m(torch.randn(10, 12))
    assert terms["balance"] > 0 and terms["balance"].requires_grad
    from clbench.plugins.build import check_init_args

    for cls, kwargs, field in [(MHMoE, {"top_k": None}, "top_k"), (LoRAMoE, {"heads": 2}, "heads"),
                               (LoRAMoE, {"top_k": 5}, "top_k")]:  # checks across arguments: in the strategy
        with pytest.raises(UserError) as err:
            cls(**kwargs)
        assert err.value.where == f"strategy.init_args.{field}"
    for cls, kwargs, field in [(MHMoE, {"top1_gate": "x"}, "top1_gate"), (LoRAMoE, {"num_experts": 0}, "num_experts"),
                               (LoRAMoE, {"dropout": 1.0}, "dropout")]:  # one argument's range: its signature
        with pytest.raises(UserError) as err:
            check_init_args(cls, kwargs, "strategy.init_args")
        assert err.value.where == f"strategy.init_args.{field}"
    with pytest.raises(UserError, match="does not divide"):
        build(MHMoE(heads=5), stream(4))


def two_expert_layer(**kw) -> MoELoRALinear:
    """LoRAMoE with 2 experts on a 2-wide input and router weight 10·I: the input [1, -1] goes
    (almost) entirely to expert 0, [-1, 1] to expert 1."""
    m = MoELoRALinear(nn.Linear(2, 2), kind="loramoe", num_experts=2, r=1, balance_weight=1.0, **kw)
    with torch.no_grad():
        m.lora_router.copy_(10 * torch.eye(2).view(1, 2, 2))
    return m


def balance_of(m: MoELoRALinear, x: torch.Tensor, **units) -> float:
    from clbench.models import routing_channel as routing
    from clbench.models import auxiliary

    with auxiliary.collect() as terms, routing.units(**units):
        m(x)
    return terms["balance"].item()


A, B = [1.0, -1.0], [-1.0, 1.0]  # one token routed to expert 0, one to expert 1


@pytest.mark.parametrize("top_k", [None, 1])
@pytest.mark.parametrize("samples,expected", [
    ([[A], [B]], 4 / 3),             # the issue's case: Z = [1,0,0,1], var 1/3, mean 1/2 (batch sum: 0)
    ([[A], [A], [B]], 1.2),          # Z = [1,0,1,0,0,1]: var 0.3, mean 1/2
    ([[A, B], [B, A]], 0.0),         # each sample spreads evenly: every entry 1
    ([[A, A], [B]], 44 / 27),        # Z = [2,0,0,1] (the second sample padded): var 11/12, mean 3/4
])
def test_localized_balance_takes_the_cv_over_samples_and_experts(samples, expected, top_k):
    """Hand-worked values of LoRAMoE's released term (δ = 0): cv² = sample variance / mean² of
    the per-sample importances, not of their batch sum."""
    width = max(len(s) for s in samples)
    x = torch.tensor([s + [[0.0, 0.0]] * (width - len(s)) for s in samples])
    mask = torch.tensor([[True] * len(s) + [False] * (width - len(s)) for s in samples])
    got = balance_of(two_expert_layer(top_k=top_k), x, token_mask=mask)
    assert got == pytest.approx(expected, abs=1e-6)


def test_localized_balance_weights_importance_by_type_and_leaves_padding_out():
    from clbench.models.layers.moe_lora import localized_balance

    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    # δ = 0.5: a type-1 sample weighs expert 0 (its type) by 1.5, expert 1 by 0.5; type 0 the reverse
    assert localized_balance(q, torch.tensor([1, 1]), 0.5).item() == pytest.approx(2.0)  # Z = [1.5,0,0,.5]
    assert localized_balance(q, torch.tensor([1, 0]), 0.5).item() == pytest.approx(4 / 3)  # Z = [1.5,0,0,1.5]
    assert localized_balance(q, 0, 0.5).item() == pytest.approx(2.0)                       # Z = [.5,0,0,1.5]
    even = torch.ones(2, 4)  # 4 experts: the first two of type 1
    assert localized_balance(even, 1, 0.0).item() == 0.0
    z = torch.tensor([1.5, 1.5, 0.5, 0.5] * 2)
    assert localized_balance(even, 1, 0.5).item() == pytest.approx((z.var() / z.mean() ** 2).item())
    # per head (MH-MoE): each head's experts split in halves, cv² over all 12 entries
    # Z = [1.5, 0] × 3 heads, [0, .5] × 3: mean 1/2, variance 4.5/11
    assert localized_balance(q.view(2, 1, 2).expand(2, 3, 2), torch.tensor([1, 1]), 0.5).item() \
        == pytest.approx(18 / 11)
    with pytest.raises(ValueError, match="types"):
        localized_balance(q, None, 0.5)
    with pytest.raises(ValueError, match="odd"):
        MoELoRALinear(nn.Linear(2, 2), kind="loramoe", num_experts=3, balance_delta=0.5)
    # the layer: the strategy's sample type reaches the term
    m = two_expert_layer(top_k=None, balance_delta=0.5)
    m.sample_type = 1
    assert balance_of(m, torch.tensor([[A], [B]])) == pytest.approx(2.0, abs=1e-6)  # Z = [1.5,0,0,.5]
    # padding tokens add nothing: a padded token that would route to expert 1
    x = torch.tensor([[A, B], [B, A]])
    padded = balance_of(two_expert_layer(), x, token_mask=torch.tensor([[True, False], [True, False]]))
    assert padded == pytest.approx(4 / 3, abs=1e-6)
    assert balance_of(two_expert_layer(), x) == pytest.approx(0.0, abs=1e-6)


def test_strategy_sets_the_task_type_and_refuses_delta_without_types():
    experiences = stream(4)
    names = [e.name for e in experiences]
    model = lm()
    strategy = LoRAMoE(num_experts=4, top_k=None, r=2, balance_weight=0.1, balance_delta=0.1,
                       knowledge_tasks=[names[1]])
    module = build(strategy, experiences, model)
    layers = moe_layers(model)
    assert all(m.balance_delta == 0.1 for m in layers)
    for exp, kind in zip(experiences, [0, 1]):
        train(module, exp, steps=1)
        assert {m.sample_type for m in layers} == {kind}
    for kwargs, field in [({"balance_delta": 0.1}, "knowledge_tasks"),
                          ({"balance_delta": 0.1, "knowledge_tasks": [], "num_experts": 3}, "balance_delta")]:
        with pytest.raises(UserError) as err:
            LoRAMoE(**kwargs)
        assert err.value.where == f"strategy.init_args.{field}"
    with pytest.raises(UserError, match="not tasks of this stream"):
        build(LoRAMoE(knowledge_tasks=["no-such-task"]), stream(4))


def test_runner_reports_expert_utilization_and_a_crashed_run_resumes_to_the_same_r(tmp_path, monkeypatch):
    from clbench.engine.runner import run

    cfg = lm_config({"class_path": "mh_moe", "init_args": {"heads": 4, "r": 2}})
    reference = run(cfg, tmp_path / "reference")
    util = reference["expert_utilization"]  # per stage, per adapted layer
    assert len(util) == 2 and all(len(stage) == 6 for stage in util) and reference["train_expert_utilization"]
    assert all(len(row) == 16 for stage in util for figures in stage.values() for row in figures["utilization"])
    # per transformer layer: gate/up 16 experts · 2 · (16 + 128) + 4 · 64 router, down 16 · 2 · (32 + 64) + 4 · 128
    assert reference["model"]["params_trainable"] == 2 * (2 * (4608 + 256) + 3072 + 512)
    assert reference["model"]["adapter_scales"] == [8.0]  # alpha 16 (the default) at r = 2
    # N_eff per stage over the test tokens of the tasks before that stage's (MH-MoE's old tasks):
    # none after the first experience; padding is never a unit
    comps = reference["route_compositions"]
    assert len(comps) == 2 and comps[0] == {} and set(comps[1]) == set(util[0])
    layer = sorted(comps[1])[0]
    units = [[u for u in stage[layer]["units"] if u] for stage in util]  # per domain with a test set
    assert len(units[0]) == 2 and units[0] == units[1]  # every test column, every stage
    # after the second experience: the first task's units only, not the task just trained
    assert comps[1][layer]["units"] == units[1][0] != sum(units[1])
    assert all(v["n_eff"] >= 1.0 for v in comps[1].values())
    final = {name: v["n_eff"] for name, v in comps[-1].items()}
    assert reference["scores"]["n_eff"] == pytest.approx(sum(final.values()) / len(final))
    # the per-layer values beside their mean, and which tasks they were measured on
    assert reference["n_eff"][0] is None
    assert reference["n_eff"][1] == {"old_tasks": [reference["experiences"][0]], "layers": final,
                                     "mean": pytest.approx(reference["scores"]["n_eff"])}

    crash_at(monkeypatch, "stage:1:step:2", cfg, tmp_path / "crashed")
    saved = torch.load(tmp_path / "crashed" / "checkpoint.pt", weights_only=True)
    assert saved["state"]["stage"] == 1 and any(k.endswith("up_proj.lora_router") for k in saved["model"])
    resumed = run(cfg, tmp_path / "crashed", resume=True)
    assert resumed["r_matrix"] == reference["r_matrix"]
    assert resumed["expert_utilization"] == util
    assert resumed["route_compositions"] == reference["route_compositions"]


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory):
    """A random 30-layer Llama (the depth of SmolLM2-135M) of width 16, saved and loaded like a
    downloaded checkpoint."""
    from clbench.models.lm.fixtures import write_tiny_model
    from clbench.models.lm.loading import EMBEDDED_TOKENIZERS

    return write_tiny_model(tmp_path_factory.mktemp("lm") / "llama-30", EMBEDDED_TOKENIZERS["trace-mini"](), "llama",
                            layers=30, hidden=16, heads=2, intermediate=16, max_positions=256)


@pytest.mark.parametrize("strategy", ["moses", "mh_moe", "loramoe"])
def test_moe_methods_with_their_defaults_report_n_eff_on_a_30_layer_model(strategy, deep_model, tmp_path):
    """Every default targets every layer: each adapted projection gets its route-wise N_eff after
    every stage but the first (no old task yet), from labelled units only (MoSEs' batches split
    across tasks' keys included)."""
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run
    from helpers import tiny_config

    raw = tiny_config(benchmark={"class_path": "trace-mini",
                                 "init_args": {"tasks": ["FOMC", "NumGLUE-cm"], "n_train": 8, "n_test": 4}},
                      model={"class_path": "hf_causal_lm", "init_args": {"path": str(deep_model)}},
                      objective={"class_path": "causal_lm", "init_args": {"max_length": 96, "max_new_tokens": 2}},
                      strategy={"class_path": strategy},
                      train={"epochs": 1, "batch_size": 8, "optimizer": {"class_path": "adamw", "init_args": {"lr": 0.01}}})
    raw["model"]["init_args"].pop("hidden", None)
    result = run(resolve_config(raw), tmp_path / strategy)
    layers = {"moses": 60, "mh_moe": 90, "loramoe": 90}[strategy]  # q/v, or the MLP's gate/up/down, x 30
    assert result["route_compositions"][0] == {}
    for stage in result["route_compositions"][1:]:
        assert len(stage) == layers
        assert all(figures["n_eff"] >= 1 and "unlabelled" not in figures for figures in stage.values())
    assert result["scores"]["n_eff"] >= 1
