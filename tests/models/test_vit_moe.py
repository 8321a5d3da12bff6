"""The thesis's MoE vision transformers: the MoE layer, its routers and the vit_moe factory."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
from helpers import tiny_config

from clbench.models import auxiliary
from clbench.models.vision import vit_moe
from clbench.models.vision.moe import MoEMLP
from clbench.models.vision.routers import EMACentroidRouter, SwitchRouter, balance_loss, repulsion

TINY = dict(patch_size=4, embed_dim=32, depth=4, num_heads=4, mlp_ratio=2.0)
SHAPE = (1, 8, 8)


def _tiny(seed=0, **kwargs):
    torch.manual_seed(seed)
    return vit_moe(10, SHAPE, **{**TINY, **kwargs}).eval()


@pytest.mark.parametrize("level", ["image", "token"])
def test_one_expert_with_top1_computes_exactly_the_dense_vit(level):
    dense = _tiny(label="ViT")
    moe = _tiny(num_experts=1, top_k=1, moe_blocks=[2, 3], expert_init="copy", level=level)
    assert isinstance(moe.blocks[2].mlp, MoEMLP) and not isinstance(dense.blocks[2].mlp, MoEMLP)
    x = torch.randn(6, *SHAPE)
    with torch.no_grad():
        assert torch.equal(moe(x), dense(x))


@pytest.mark.parametrize("kwargs", [
    dict(label="MoE"),
    dict(label="MoE-many", level="token"),
    dict(num_experts=4, num_shared=1, expert_lr_mult=[1.0, 0.5, 0.1, 0.01]),
    dict(label="MoE_ensemble_LR_scale"),
    dict(label="EMA router"),
])
def test_model_transfer_equals_the_dense_model_at_initialisation(tmp_path, kwargs):
    dense = _tiny(seed=1, label="ViT")
    path = tmp_path / "dense.pth"
    torch.save(dense.state_dict(), path)
    moe = _tiny(seed=2, moe_blocks=[2, 3], weights_path=str(path), **kwargs)
    x = torch.randn(8, *SHAPE)
    with torch.no_grad():
        assert (moe(x) - dense(x)).abs().max().item() <= 1e-5
    # without the weights file the experts are drawn independently and the model differs
    fresh = _tiny(seed=2, moe_blocks=[2, 3], **kwargs)
    with torch.no_grad():
        assert (fresh(x) - dense(x)).abs().max().item() > 1e-3


def test_transfer_into_another_class_count_keeps_the_body_and_a_fresh_head(tmp_path):
    dense = _tiny(seed=1, label="ViT")
    torch.save(dense.state_dict(), tmp_path / "dense.pth")
    torch.manual_seed(3)
    moe = vit_moe(5, SHAPE, **TINY, moe_blocks=[3], weights_path=str(tmp_path / "dense.pth")).eval()
    x = torch.randn(4, *SHAPE)
    with torch.no_grad():
        assert torch.allclose(moe.forward_features(x), dense.forward_features(x), atol=1e-5)
    assert moe.head.out_features == 5


def _reference(layer: MoEMLP, x: torch.Tensor, experts: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
    """A per-unit loop over the chosen experts (what the sorted dispatch must equal)."""
    units = x.reshape(-1, 1, x.shape[-1]) if layer.level == "token" else x
    w1, b1, w2, b2 = layer.experts.effective()
    out = torch.zeros_like(units)
    for u in range(units.shape[0]):
        for slot in range(experts.shape[1]):
            e = int(experts[u, slot])
            h = torch.nn.functional.gelu(units[u] @ w1[e].T + b1[e])
            out[u] += gates[u, slot] * (h @ w2[e].T + b2[e])
    return out.reshape(x.shape)


@pytest.mark.parametrize("level,top_k", [("token", 2), ("image", 1), ("image", 3)])
def test_sorted_dispatch_equals_a_per_unit_loop_and_runs_under_bf16(level, top_k):
    torch.manual_seed(0)
    layer = MoEMLP(16, 24, num_experts=4, top_k=top_k, level=level)
    x = torch.randn(5, 7, 16)
    experts, gates, _ = layer.router(layer._feats(x))
    assert len(set(experts.reshape(-1).tolist())) > 1  # several experts really used
    assert torch.allclose(layer(x), _reference(layer, x, experts, gates), atol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = layer(x)
    assert torch.allclose(low.float(), layer(x), atol=5e-2)


def test_top1_gate_is_one_yet_the_switch_router_learns_from_the_task():
    torch.manual_seed(0)
    layer = MoEMLP(8, 16, num_experts=4, top_k=1, level="token")
    x = torch.randn(3, 5, 8)
    _, gates, probs = layer.router(layer._feats(x))
    assert torch.equal(gates, torch.ones_like(gates)) and not torch.allclose(probs, torch.ones_like(probs))
    layer(x).pow(2).sum().backward()
    assert layer.router.weight.grad.abs().sum() > 0


def test_balance_loss_and_its_annealing_have_their_documented_values():
    # KL(p || uniform) on hand-built fractions
    assert balance_loss(torch.tensor([0.25, 0.25, 0.25, 0.25])).item() == pytest.approx(0.0, abs=1e-7)
    assert balance_loss(torch.tensor([1.0, 0.0])).item() == pytest.approx(math.log(2))
    assert balance_loss(torch.tensor([0.75, 0.25])).item() == pytest.approx(
        0.75 * math.log(1.5) + 0.25 * math.log(0.5))
    # router probabilities from a hand-set linear router: logits (a, 0) for feature (a, 0)
    router = SwitchRouter(2, 2, top_k=1, balance_weight=0.5, anneal_steps=4).train()
    with torch.no_grad():
        router.weight.copy_(torch.eye(2))
    feats = torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]])  # probs (0.75, 0.25) and (0.5, 0.5)
    p0 = (0.75 + 0.5) / 2
    kl = p0 * math.log(2 * p0) + (1 - p0) * math.log(2 * (1 - p0))
    for t in range(6):
        with auxiliary.collect() as terms:
            router(feats)
        expected = 0.5 * max(0.0, 1 - t / 4) * kl
        if expected:
            assert terms["balance"].item() == pytest.approx(expected, rel=1e-5)
            assert terms["balance"].requires_grad
        else:
            assert "balance" not in terms  # lambda_lb(t) = 0 from t = T_anneal on
    assert int(router.step) == 6
    # outside a training step nothing is added and evaluation does not advance t
    router.eval()
    with auxiliary.collect() as terms:
        router(feats)
    assert int(router.step) == 6
    constant = SwitchRouter(2, 2, balance_weight=0.5, anneal_steps=0)
    constant.step.fill_(10_000)
    assert constant.current_balance_weight() == 0.5


def test_ema_centroids_start_from_one_image_per_expert_and_move_toward_routed_batch_means():
    router = EMACentroidRouter(2, 2, alpha_fast=0.8, alpha_slow=0.9, beta=0.5).train()
    first = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.2], [0.2, 1.0]])
    experts, _, _ = router(first)
    # initialised to images 0 and 1, then images (0, 2) -> expert 0 and (1, 3) -> expert 1
    assert experts[:, 0].tolist() == [0, 1, 0, 1]
    fast0 = 0.8 * first[0] + 0.2 * first[[0, 2]].mean(0)
    fast1 = 0.8 * first[1] + 0.2 * first[[1, 3]].mean(0)
    assert torch.allclose(router.fast, torch.stack([fast0, fast1]))
    assert torch.allclose(router.slow, torch.stack([0.9 * first[0] + 0.1 * fast0, 0.9 * first[1] + 0.1 * fast1]))
    # a batch routed entirely to expert 0 moves only expert 0, by the configured rates
    fast, slow = router.fast.clone(), router.slow.clone()
    batch = torch.tensor([[2.0, 0.1], [3.0, 0.5]])
    assert router(batch)[0][:, 0].tolist() == [0, 0]
    new_fast0 = 0.8 * fast[0] + 0.2 * batch.mean(0)
    assert torch.allclose(router.fast[0], new_fast0)
    assert torch.allclose(router.slow[0], 0.9 * slow[0] + 0.1 * new_fast0)
    assert torch.equal(router.fast[1], fast[1]) and torch.equal(router.slow[1], slow[1])
    # evaluation routes without moving the centroids
    router.eval()
    router(batch)
    assert torch.allclose(router.fast[0], new_fast0)


def test_ema_router_losses_have_their_documented_values():
    cents = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    # nearest other centroid per expert: 1, 1, 0 -> hinge at margin 0.5: (0.5 + 0.5 + 0) / (3 * 1)
    assert repulsion(cents, margin=0.5, k=1).item() == pytest.approx(1 / 3)
    assert repulsion(cents, margin=0.5, k=2).item() == pytest.approx((0.5 + 0.5) / 6)
    router = EMACentroidRouter(2, 2, alpha_fast=0.0, alpha_slow=0.0, lambda_align=1.0, lambda_cons=1.0,
                               lambda_fast=1.0, lambda_slow=1.0, margin=-1.0).train()
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]], requires_grad=True)
    with auxiliary.collect() as terms:
        router(z)
    # alpha = 0: centroids are this batch's means, so every image sits on its own centroid
    assert terms["align"].item() == pytest.approx(0.0, abs=1e-6)
    assert terms["cons"].item() == pytest.approx(0.0, abs=1e-6)
    assert terms["fast"].item() == pytest.approx(0.0 + 1.0, abs=1e-6)  # cos = 0, margin -1
    terms["fast"].backward()
    assert z.grad is not None  # the gradient reaches the latent through the batch means


def test_learning_rate_multipliers_scale_each_experts_adam_step():
    torch.manual_seed(0)
    layer = MoEMLP(8, 16, num_experts=0, num_shared=2, shared_lr_mult=[1.0, 0.1])
    before = [w.detach().clone() for w in layer.shared.effective()][0]
    opt = torch.optim.Adam(layer.parameters(), lr=1e-3)
    layer(torch.randn(4, 3, 8)).pow(2).sum().backward()
    opt.step()
    step = (layer.shared.effective()[0].detach() - before).abs().amax(dim=(1, 2))
    assert step[0].item() == pytest.approx(1e-3, rel=1e-2)
    assert step[1].item() == pytest.approx(1e-4, rel=1e-2)


@pytest.mark.parametrize("router", ["switch", "ema_centroid"])
def test_utilization_rows_sum_to_one_per_domain_in_a_runner_run(router):
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    args = {**TINY, "moe_blocks": [2, 3], "num_experts": 4, "router": router}
    cfg = resolve_config(tiny_config(model={"class_path": "vit_moe", "init_args": args}))
    result = run(cfg, None)
    stages = result["expert_utilization"]
    assert len(stages) == 3
    for stage in stages:
        assert sorted(stage) == ["blocks.2.mlp", "blocks.3.mlp"]
        for figures in stage.values():
            utilization = torch.tensor(figures["utilization"], dtype=torch.float64)
            assert utilization.shape == (3, 4)
            assert torch.allclose(utilization.sum(1), torch.ones(3, dtype=torch.float64))
    assert len(result["train_expert_utilization"]) == 3


def test_the_thesis_suite_names_the_thesis_labels_and_passes_preflight():
    from clbench.leaderboard.suite import load_suite, preflight

    from clbench.models.vision.vit_moe import LABELS

    suite = load_suite("configs/suites/thesis.yaml")
    preflight(suite)
    labels = {run.config["model"]["init_args"]["label"] for run in suite.runs}
    assert labels == set(LABELS)
    assert {run.config["strategy"]["class_path"] for run in suite.runs} == {"naive"}


@pytest.mark.slow
def test_sorted_dispatch_compiles_with_torch_compile():
    """torch.compile traces the dispatch (data-dependent expert slices break the graph, not the
    result): forward and input gradient equal eager mode. ``aot_eager`` checks the capture and
    autograd without the C++ code generation of ``inductor`` (minutes on a small CPU)."""
    torch.manual_seed(0)
    layer = MoEMLP(16, 24, num_experts=4, top_k=2, level="token")
    x = torch.randn(5, 7, 16, requires_grad=True)
    eager = layer(x)
    (grad,) = torch.autograd.grad(eager.sum(), x)
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager")(x)
    (compiled_grad,) = torch.autograd.grad(compiled.sum(), x)
    assert torch.allclose(compiled, eager, atol=1e-5) and torch.allclose(compiled_grad, grad, atol=1e-5)


def test_a_grouped_product_per_matrix_computes_what_the_loop_over_experts_computes():
    """The grouped path on units sorted by expert, one expert getting none, learning-rate
    multipliers on: the loop's outputs and gradients, up to where the bias is added (float32,
    which the CPU's grouped product takes eagerly)."""
    from torch import nn

    torch.manual_seed(0)
    bank = MoEMLP(16, 24, num_experts=4, expert_lr_mult=[1, 0.5, 0.1, 1]).experts
    experts = torch.tensor([0, 0, 2, 2, 2, 3])  # expert 1 gets nothing
    x = torch.randn(6, 5, 16)
    results = []
    for grouped in (False, True):
        bank.zero_grad()
        inputs = x.clone().requires_grad_(True)
        weights = bank.effective()
        if grouped:
            out = bank.run_grouped(inputs, experts, weights, nn.Identity())
        else:
            out = torch.cat([bank.run(e, inputs[experts == e], weights, nn.Identity()) for e in range(4)
                             if (experts == e).any()])
        out.pow(2).sum().backward()
        results.append([out, inputs.grad] + [p.grad.clone() for p in bank.parameters()])
    for loop, grouped in zip(*results):
        torch.testing.assert_close(grouped, loop, rtol=1e-5, atol=1e-6)
    assert results[1][3].abs().sum() > 0 and results[1][3][1].eq(0).all()  # b1's gradient: none for expert 1


@pytest.mark.parametrize("level,top_k", [("image", 1), ("token", 2)])
def test_grouped_dispatch_runs_in_bf16_and_the_loop_in_float32(level, top_k):
    """Under bf16 autocast the grouped layer computes what the looping one does, to bf16's
    rounding, shared experts included; in float32 it runs the loop itself (the same numbers)."""
    torch.manual_seed(0)
    loop = MoEMLP(16, 24, num_experts=5, top_k=top_k, num_shared=1, level=level)
    grouped = MoEMLP(16, 24, num_experts=5, top_k=top_k, num_shared=1, level=level, dispatch="grouped")
    grouped.load_state_dict(loop.state_dict())
    x = torch.randn(3, 7, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with mock.patch.object(grouped.experts, "run_grouped", wraps=grouped.experts.run_grouped) as spy:
            y_grouped = grouped(x)
        y_loop = loop(x)
    assert spy.call_count == 1 and y_grouped.dtype == y_loop.dtype == x.dtype
    torch.testing.assert_close(y_grouped, y_loop, rtol=0.05, atol=0.02)
    with mock.patch.object(grouped.experts, "run_grouped") as spy:
        assert torch.equal(grouped(x), loop(x)) and not spy.called


def test_grouped_dispatch_is_one_graph_without_a_host_sync():
    """``fullgraph=True`` refuses a graph break, which reading the slices' sizes on the host
    (``.tolist()``, the loop's dispatch) is: the grouped dispatch compiles whole (in bf16)."""
    torch.manual_seed(0)
    layer = MoEMLP(16, 24, num_experts=4, top_k=2, level="token", dispatch="grouped").bfloat16()
    x = torch.randn(5, 7, 16, dtype=torch.bfloat16, requires_grad=True)
    eager = layer(x)
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(compiled, eager)
    looping = MoEMLP(16, 24, num_experts=4, top_k=2, level="token").bfloat16()
    torch._dynamo.reset()
    with pytest.raises(Exception, match="(?i)graph break|tolist|data-dependent|Unsupported"):
        torch.compile(looping, backend="aot_eager", fullgraph=True)(x)


def test_vit_moe_passes_dispatch_to_its_layers_and_the_prototype_router_refuses_it():
    from clbench.config.validation import ArgumentError

    assert _tiny(num_experts=3, moe_blocks=[3], dispatch="grouped").blocks[3].mlp.dispatch == "grouped"
    assert _tiny(num_experts=3, moe_blocks=[3]).blocks[3].mlp.dispatch == "loop"
    with pytest.raises(ArgumentError, match="dispatch"):
        _tiny(router="prototype", moe_blocks=[3], dispatch="grouped")
