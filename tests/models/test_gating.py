"""The gate formulas every router shares (clbench.models.gating)."""

import pytest
import torch

from clbench.models.gating import GATE_FORMULAS, dense_gates, top_k_gates


def _picked():
    torch.manual_seed(0)
    logits = torch.randn(5, 6, requires_grad=True)
    return logits, logits.topk(2, dim=-1).indices


def test_softmax_of_the_chosen_logits_equals_the_normalized_probabilities():
    logits, idx = _picked()
    probs = logits.softmax(-1)
    soft = top_k_gates(logits, idx, "softmax")
    norm = top_k_gates(probs, idx, "normalized")
    torch.testing.assert_close(soft, norm)
    torch.testing.assert_close(soft.sum(-1), torch.ones(5))
    torch.testing.assert_close(top_k_gates(probs, idx, "probability"), probs.gather(-1, idx))


def test_straight_through_has_the_normalized_value_and_the_probability_gradient():
    logits, idx = _picked()
    straight = top_k_gates(logits.softmax(-1), idx, "straight_through")
    assert torch.equal(straight, top_k_gates(logits.softmax(-1), idx, "normalized"))
    (g_st,) = torch.autograd.grad(straight.sum(), logits)
    (g_p,) = torch.autograd.grad(top_k_gates(logits.softmax(-1), idx, "probability").sum(), logits)
    torch.testing.assert_close(g_st, g_p)
    # the normalized weights sum to 1 in every row: their sum has no gradient, the straight-through one has
    (g_norm,) = torch.autograd.grad(top_k_gates(logits.softmax(-1), idx, "normalized").sum(), logits)
    assert g_norm.abs().max() < 1e-6 < g_st.abs().max()


def test_one_is_one_and_sends_the_router_no_gradient():
    logits, idx = _picked()
    ones = top_k_gates(logits, idx[:, :1], "one")
    assert torch.equal(ones, torch.ones(5, 1)) and not ones.requires_grad


def test_dense_gates_put_the_weights_at_the_chosen_experts_and_zero_elsewhere():
    logits, idx = _picked()
    weights = top_k_gates(logits, idx, "softmax")
    dense = dense_gates(weights, idx, like=logits)
    assert dense.shape == logits.shape and dense.dtype == logits.dtype
    assert torch.equal(dense.gather(-1, idx), weights)
    assert (dense != 0).sum(-1).tolist() == [2] * 5


def test_an_unknown_formula_is_named_in_the_error():
    logits, idx = _picked()
    with pytest.raises(ValueError, match="gate formula must be one of"):
        top_k_gates(logits, idx, "renormalised")
    assert len(GATE_FORMULAS) == 5
