"""The MoE-in-CL theory learner (Li et al.): Algorithm 1's closed forms, its invariant, the
runner path against the vectorised simulation, and the Fig. 2 claims measured over seeds."""

from __future__ import annotations

import pytest
import torch

from helpers import REPO, crash_at


def _round_case(M=4, d=10, s=6, seed=0):
    from clbench.strategies.moe_theory import GateState

    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    experts = torch.randn(1, M, d, generator=g, dtype=f64)
    theta = 0.3 * torch.randn(1, M, d, generator=g, dtype=f64)
    theta -= theta.mean(1, keepdim=True)
    X = torch.randn(1, d, s, generator=g, dtype=f64)
    y = torch.randn(1, s, generator=g, dtype=f64)
    state = GateState.zeros(1, M)
    state.counts += torch.tensor([[2.0, 1.0, 0.0, 3.0]])
    state.prob_sum += torch.tensor([[0.5, 0.2, 0.0, 0.9]])
    state.t = 6
    return experts, theta, state, X, y


def test_one_round_is_the_minimum_norm_fit_and_the_closed_form_gating_gradient():
    from clbench.strategies.moe_theory import moe_round

    experts, theta, state, X, y = _round_case()
    before, theta0 = experts.clone(), theta.clone()
    noise = torch.zeros(1, 4, dtype=torch.float64)
    info = moe_round(experts, theta, state, X, y, noise, eta=0.5, alpha=0.5, gamma=0.3, terminate=False, explore=0)
    m = int(info.expert)
    assert m == int((theta0[0] @ X[0].sum(1)).argmax())
    # Eq. 5: the chosen expert now fits the round exactly, moved within the span of X (minimum norm)
    assert torch.allclose(X[0].T @ experts[0, m], y[0], atol=1e-10)
    step = experts[0, m] - before[0, m]
    in_span = X[0] @ torch.linalg.lstsq(X[0], step).solution
    assert torch.allclose(in_span, step, atol=1e-10)
    others = [k for k in range(4) if k != m]
    assert torch.equal(experts[0, others], before[0, others])
    # App. D: theta moved by -eta * autograd of (locality + load-balance) losses at the old theta
    th = theta0[0].clone().requires_grad_(True)
    pi = (th @ X[0].sum(1)).softmax(-1)
    counts = torch.tensor([2.0, 1.0, 0.0, 3.0], dtype=torch.float64)
    counts[m] += 1
    prob = torch.tensor([0.5, 0.2, 0.0, 0.9], dtype=torch.float64) + pi * torch.nn.functional.one_hot(
        torch.tensor(m), 4)
    t = 7
    loss = pi[m] * step.norm() + 0.5 * 4 * ((counts / t) * (prob / t)).sum()
    grad, = torch.autograd.grad(loss, th)
    assert torch.allclose(theta[0] - theta0[0], -0.5 * grad, atol=1e-12)
    assert info.loss.item() == pytest.approx(loss.item())
    assert torch.allclose(theta.sum(1), theta0.sum(1), atol=1e-12)  # Lemma 4: gradients sum to 0


def test_gating_parameters_sum_to_zero_after_every_round_and_termination_freezes_them():
    from clbench.strategies.moe_theory import simulate

    for M in (5, 20):
        r = simulate([0, 1, 2], 300, M, terminate=False)
        assert r["theta_sum"].max() < 1e-12  # Lemma 4, every round, every seed
    r = simulate([0, 1, 2], 300, 10, terminate=True)
    assert r["theta_sum"].max() < 1e-12
    stopped = r["stopped_at"]
    assert (stopped > r["explore"]).all()  # never during exploration (T_1 = 20)
    rounds = torch.arange(1, 301)
    for b in range(3):  # the gate moves every round until termination, then never again
        assert (r["gate_step"][b, rounds < stopped[b]] > 0).all()
        assert (r["gate_step"][b, rounds >= stopped[b]] == 0).all()


def test_the_runner_path_gives_the_simulations_errors_in_its_r_matrix_and_resumes(tmp_path, monkeypatch):
    """20 rounds as 20 experiences: R[t][tau] is ||w_t^(m_tau) - w_{n_tau}||^2, so its rows give
    the simulation's F_t and G_t; routing per task is recorded; a crash resumes bit-identically."""
    from clbench.config.load import resolve_config
    from clbench.metrics.theory import forgetting_curve, generalisation_curve
    from clbench.engine.runner import ContinualRun, run
    from clbench.seeding import derive
    from clbench.strategies.moe_theory import simulate

    raw = {"seed": 3, "benchmark": {"class_path": "moe-regression", "init_args": {"rounds": 20, "seed": 3}},
           "model": {"class_path": "clbench.strategies.moe_theory:moe_theory_model", "init_args": {"num_experts": 3}},
           "strategy": {"class_path": "moe_theory", "init_args": {"explore": 4}},
           "train": {"epochs": 2, "batch_size": 64, "optimizer": {"class_path": "sgd", "init_args": {"lr": 0.0}}},
           "logging": {"progress": False, "tensorboard": False}}
    complete = ContinualRun(resolve_config(raw), tmp_path / "out")
    result = complete.execute()
    assert result["r_metric"] == {"names": ["mse"] * 20, "higher_is_better": False}
    assert result["benchmark"]["synthetic"] is True  # the simulator's data: tables say so
    assert complete.parts.strategy.seed == derive(3, "strategy")
    sim = simulate([3], 20, 3, explore=4, noise_seeds=[derive(3, "strategy")])
    R = torch.tensor(result["r_matrix"], dtype=torch.float64)
    assert torch.allclose(forgetting_curve(R), sim["forgetting"][0], atol=1e-9)
    assert torch.allclose(generalisation_curve(R), sim["generalisation"][0], atol=1e-9)
    assert torch.allclose(torch.diagonal(R), sim["error"][0], atol=1e-9)
    assert result["scores"]["forgetting"] > 0
    # training routing is recorded per task (domain = task id): one expert per round
    tasks = sim["task"][0]
    for record, task, expert in zip(result["train_expert_utilization"], tasks, sim["expert"][0]):
        row = record["MoETheoryModel"]["utilization"][int(task)]
        assert row[int(expert)] == pytest.approx(1.0)

    crash_at(monkeypatch, "stage:9:step:1", resolve_config(raw), tmp_path / "crashed")
    assert run(resolve_config(raw), tmp_path / "crashed", resume=True)["r_matrix"] == result["r_matrix"]


def test_a_batch_smaller_than_a_round_is_refused(tmp_path):
    from clbench.config.load import resolve_config
    from clbench.errors import UserError
    from clbench.engine.runner import run

    raw = {"benchmark": {"class_path": "moe-regression", "init_args": {"rounds": 2}},
           "model": {"class_path": "clbench.strategies.moe_theory:moe_theory_model", "init_args": {}},
           "strategy": {"class_path": "moe_theory"},
           "train": {"epochs": 1, "batch_size": 4, "optimizer": {"class_path": "sgd", "init_args": {"lr": 0.0}}},
           "logging": {"progress": False, "tensorboard": False}}
    with pytest.raises(UserError, match="batch_size"):
        run(resolve_config(raw), None)


def test_fig2_claims_over_ten_seeds():
    """T = 2,000, N = 6, K = 3 (Fig. 2). Measured, not tuned: termination lowers forgetting and
    generalisation error for every M > 1, MoE beats one expert, and late model errors fall."""
    from clbench.strategies.moe_theory import simulate

    seeds = list(range(10))
    single = simulate(seeds, 2000, 1)
    for M in (5, 10, 20):
        on = simulate(seeds, 2000, M, terminate=True)
        off = simulate(seeds, 2000, M, terminate=False)
        f_on, f_off = on["forgetting"][:, -1].mean(), off["forgetting"][:, -1].mean()
        g_on, g_off = on["generalisation"][:, -1].mean(), off["generalisation"][:, -1].mean()
        assert f_on < 0.6 * f_off and g_on < 0.6 * g_off, M
        assert g_on < 0.4 * single["generalisation"][:, -1].mean(), M
        if M > 6:  # M > N: after exploration forgetting falls, F_T well below its level at t = 100
            assert on["forgetting"][:, -1].mean() < 0.7 * on["forgetting"][:, 99].mean(), M
        assert on["error"][:, 1000:].mean() < 0.5 * off["error"][:, 1000:].mean(), M


def test_the_suite_loads_and_passes_preflight():
    from clbench.leaderboard.suite import load_suite, preflight

    suite = load_suite(REPO / "configs" / "suites" / "moe-theory.yaml")
    assert len(suite.runs) == 8 * 3
    assert {r.config["model"]["init_args"]["num_experts"] for r in suite.runs} == {1, 5, 10, 20}
    preflight(suite)
