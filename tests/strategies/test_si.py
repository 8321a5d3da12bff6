"""Synaptic Intelligence: the per-step path integral against hand-computed steps and the loss it
accounts for, the importance and surrogate of Eqs. 4-5, parameters that come and go, state, and
digits runs through the runner (crashed and resumed)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import crash_at, make_experience, tiny_config, tiny_model
from test_strategies import fit, loader_factory, make_module, roundtrip, set_params

from clbench.errors import UserError
from clbench.strategies.si import SI


def seeded_importance(model, seed: int = 0) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(seed)
    omega = {n: torch.rand(p.shape, generator=g) for n, p in model.named_parameters()}
    anchor = {n: p.detach() + torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
    return omega, anchor


def manual_step(strategy, module, x, y, update) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One training step through the strategy's hooks; ``update(params)`` moves the parameters.
    Returns the task-loss gradient (flat) and the parameters' change."""
    model = module.model
    params = list(model.parameters())
    task_grad = torch.autograd.grad(F.cross_entropy(model(x), y), params)
    model.zero_grad()
    logits = model(x)
    total = strategy.training_loss(module.context, x, y, logits, F.cross_entropy(logits, y))
    total.backward()
    before = [p.detach().clone() for p in params]
    strategy.before_optimizer_step(module.context, None)
    with torch.no_grad():
        update(params)
    strategy.after_optimizer_step(module.context)
    return torch.cat([g.flatten() for g in task_grad]), [p.detach() - b for p, b in zip(params, before)]


# -- the path integral -----------------------------------------------------------------------
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_omega_is_minus_task_gradient_times_actual_update(optimizer):
    """ω sums −g·Δθ over steps with g the unregularised gradient and Δθ the optimizer's update
    (SGD by hand: Δθ = −lr·(g + 2cΩ(θ − θ̃)), so ω = lr·g·(g + surrogate gradient))."""
    model = tiny_model()
    strategy = SI(c=0.7)
    module = make_module(strategy, model)
    omega, anchor = seeded_importance(model)
    strategy.surrogate.consolidate(omega, anchor)
    exp = make_experience(1, [0, 1, 2, 3] * 3)
    strategy.before_experience(module.context, exp)
    lr = 0.05
    opt = torch.optim.SGD(model.parameters(), lr=lr) if optimizer == "sgd" else \
        torch.optim.Adam(model.parameters(), lr=lr)
    expected = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        x, y = torch.randn(6, 4, generator=g), torch.randint(0, 4, (6,), generator=g)
        theta = {n: p.detach().clone() for n, p in model.named_parameters()}
        task_grad, deltas = manual_step(strategy, module, x, y, lambda params: opt.step())
        start = 0
        for (n, p), d in zip(model.named_parameters(), deltas):
            gn = task_grad[start:start + p.numel()].view_as(p)
            start += p.numel()
            expected[n] -= gn * d
            if optimizer == "sgd":  # the update by hand
                surrogate_grad = 2 * 0.7 * omega[n] * (theta[n] - anchor[n])
                torch.testing.assert_close(d, -lr * (gn + surrogate_grad), rtol=1e-4, atol=1e-6)
    for n in expected:
        torch.testing.assert_close(strategy._omega[n], expected[n], rtol=1e-4, atol=1e-7)
    if optimizer == "sgd":
        assert all((strategy._omega[n] != 0).any() for n in expected)


def full_batch_descent(strategy, module, exp, epochs: int):
    x, y = exp.train[list(range(len(exp.train)))]

    def task_loss():
        with torch.no_grad():
            return F.cross_entropy(module.model(x), y).item()

    before = task_loss()
    strategy.adapt_model(module.context, exp.position + 1)
    strategy.before_experience(module.context, exp)
    fit(module, strategy.train_loader(module.context, exp.train, loader_factory(len(exp.train))), epochs)
    after = task_loss()
    surrogate = strategy.c * strategy.surrogate.penalty(module.model).item() if strategy.importance else 0.0
    path = sum(o.sum().item() for o in strategy._omega.values())
    strategy.after_experience(module.context, exp)
    return path, before - after, surrogate


def test_path_integral_accounts_for_the_drop_of_the_task_loss():
    """Full-batch gradient descent with a small step follows the gradient flow, along which
    Σ_k ω_k equals the decrease of the task loss (Section 3), not of the regularised loss."""
    experiences = [make_experience(0, [0, 1, 2, 3] * 6), make_experience(1, [3, 2, 1, 0] * 6, seed=1)]
    strategy = SI(c=10.0, xi=0.1)
    strategy.setup(None, experiences, 0)
    module = make_module(strategy, lr=0.02)
    path, drop, _ = full_batch_descent(strategy, module, experiences[0], epochs=100)
    assert drop > 0.05 and path == pytest.approx(drop, rel=0.03)
    assert strategy.path_integral == [pytest.approx(path)]
    path, drop, surrogate = full_batch_descent(strategy, module, experiences[1], epochs=100)
    assert surrogate > 0.2 * drop  # the surrogate held the parameters back noticeably
    assert path == pytest.approx(drop, rel=0.03)
    assert abs(path - (drop - surrogate)) > 0.15 * drop  # not the drop of loss + surrogate


def test_a_step_that_moves_nothing_adds_nothing_even_with_non_finite_gradients():
    """What a step AMP skips leaves: inf/NaN gradients, unchanged parameters."""
    model = tiny_model()
    strategy = SI()
    module = make_module(strategy, model)
    strategy.before_experience(module.context, make_experience(0, [0]))
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    model[0].weight.grad[0, 0] = float("inf")
    model[2].bias.grad[1] = float("nan")
    strategy.before_optimizer_step(module.context, None)
    strategy.after_optimizer_step(module.context)
    assert all(torch.equal(o, torch.zeros_like(o)) for o in strategy._omega.values())


# -- importance and surrogate ----------------------------------------------------------------
def test_importance_is_omega_over_squared_change_plus_xi_kept_non_negative():
    """Eq. 5 with the reference code's ReLU: a parameter that moved uphill (ω < 0) gets Ω = 0 on
    the first experience and can lower, not negate, an earlier Ω; θ̃ is the end of the experience."""
    model = tiny_model()
    strategy = SI(c=0.0, xi=0.3)
    module = make_module(strategy, model)
    x, y = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 2, 3] * 2)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    steps = [1.0, -1.0, 0.5]  # descend, climb, descend: some ω end up negative
    for position in range(2):
        strategy.before_experience(module.context, make_experience(position, [0]))
        start = {n: p.detach().clone() for n, p in model.named_parameters()}
        omega = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
        for sign in steps:
            task_grad, deltas = manual_step(strategy, module, x, y,
                                            lambda ps, s=sign: [p.sub_(s * 0.1 * p.grad) for p in ps])
            offset = 0
            for (n, p), d in zip(model.named_parameters(), deltas):
                omega[n] -= task_grad[offset:offset + p.numel()].view_as(p) * d
                offset += p.numel()
        old = {n: t.clone() for n, t in strategy.importance.items()}
        strategy.after_experience(module.context, make_experience(position, [0]))
        for n, p in model.named_parameters():
            raw = omega[n] / ((p.detach() - start[n]) ** 2 + 0.3)
            expected = (old.get(n, 0) + raw).clamp_min(0)
            torch.testing.assert_close(strategy.importance[n], expected, rtol=1e-4, atol=1e-7)
            assert torch.equal(strategy.anchor[n], p.detach())
        assert any((o < 0).any() for o in omega.values())  # the clamp was exercised
        assert all((t >= 0).all() for t in strategy.importance.values())


def test_surrogate_is_zero_at_the_anchor_and_quadratic_around_it():
    model = tiny_model()
    strategy = SI(c=0.4)
    omega, anchor = seeded_importance(model, seed=1)
    strategy.surrogate.consolidate(omega, anchor)
    g = torch.Generator().manual_seed(2)
    direction = {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
    quad = sum((omega[n] * direction[n] ** 2).sum().item() for n in omega)
    module = make_module(strategy, model)
    loss = torch.tensor(0.25)
    for t in (0.0, 1.0, -2.0):
        set_params(model, {n: anchor[n] + t * direction[n] for n in anchor})
        total = strategy.training_loss(module.context, None, None, None, loss).item()
        assert total == pytest.approx(0.25 + 0.4 * t * t * quad, rel=1e-5)  # c·ΣΩ(θ−θ̃)², no ½
    assert SI(c=0.4).training_loss(module.context, None, None, None, loss) is loss  # nothing learnt yet


# -- parameters that come and go -------------------------------------------------------------
def test_only_trained_parameters_gain_importance_and_new_ones_join_later():
    experiences = [make_experience(p, [0, 1, 2, 3] * 4, seed=p) for p in range(2)]
    model = tiny_model()
    strategy = SI(c=1.0)
    strategy.setup(None, experiences, 0)
    module = make_module(strategy, model)
    model[0].requires_grad_(False)  # the first layer is frozen for the first experience
    first = copy.deepcopy(model[0].state_dict())
    for exp in experiences:
        strategy.adapt_model(module.context, exp.position + 1)
        strategy.before_experience(module.context, exp)
        fit(module, strategy.train_loader(module.context, exp.train, loader_factory()))
        strategy.after_experience(module.context, exp)
        if exp.position == 0:
            assert set(strategy.importance) == {"2.weight", "2.bias"}
            assert torch.equal(model[0].weight, first["weight"])
            model[0].requires_grad_(True)  # another change unfreezes it
    assert set(strategy.importance) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert all(strategy.importance[n].abs().sum() > 0 for n in strategy.importance)
    # A name the model no longer has is left out of the surrogate.
    strategy.surrogate.consolidate({"gone.weight": torch.ones(3)}, {"gone.weight": torch.zeros(3)})
    assert strategy.surrogate.penalty(model).item() == pytest.approx(0.0, abs=1e-12)


def test_a_parameter_that_changed_shape_is_refused():
    model = tiny_model()
    strategy = SI()
    module = make_module(strategy, model)
    strategy.surrogate.consolidate({"2.bias": torch.ones(7)}, {"2.bias": torch.zeros(7)})
    strategy.before_experience(module.context, make_experience(0, [0]))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    with pytest.raises(UserError, match="SI holds an importance of shape \\(7,\\) for '2.bias'"):
        strategy.before_optimizer_step(module.context, None)


# -- state and settings ----------------------------------------------------------------------
def test_state_round_trips_and_the_surrogate_continues():
    model = tiny_model()
    strategy = SI(c=0.3)
    omega, anchor = seeded_importance(model, seed=4)
    strategy.surrogate.consolidate(omega, anchor)
    strategy.path_integral = [0.5]
    restored = SI(c=0.3)
    restored.load_state_dict(roundtrip(strategy.state_dict()))
    assert restored.diagnostics() == {"path_integral": [0.5]}
    assert restored.surrogate.penalty(model).item() == pytest.approx(strategy.surrogate.penalty(model).item())


def test_si_rejects_bad_settings():
    from clbench.plugins.build import check_init_args

    for args, field in [({"c": -1.0}, "c"), ({"xi": 0.0}, "xi")]:
        with pytest.raises(UserError) as err:
            check_init_args(SI, args, "strategy.init_args")
        assert err.value.where == f"strategy.init_args.{field}"


# -- runs --------------------------------------------------------------------------------------
SI_ARGS = {"class_path": "si", "init_args": {"c": 10.0}}


def test_si_runs_digits_and_a_crashed_run_resumes_to_the_same_result(tmp_path, monkeypatch):
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    cfg = resolve_config(tiny_config(strategy=SI_ARGS, train={"epochs": 1, "batch_size": 32}))
    reference = run(cfg, tmp_path / "reference")
    assert reference["strategy"]["params"] == {"c": 10.0, "xi": 0.1}
    assert len(reference["strategy"]["diagnostics"]["path_integral"]) == 3
    assert all(v > 0 for v in reference["strategy"]["diagnostics"]["path_integral"])
    assert reference["r_matrix"][0][0] > 0.3  # well above chance (0.1)
    naive = run(resolve_config(tiny_config(train={"epochs": 1, "batch_size": 32})), None, source="test")
    assert naive["r_matrix"][0] == reference["r_matrix"][0]  # nothing to consolidate while learning the first
    assert naive["r_matrix"][1:] != reference["r_matrix"][1:]
    crash_at(monkeypatch, "stage:2:step:5", cfg, tmp_path / "crashed")
    saved = torch.load(tmp_path / "crashed" / "checkpoint.pt", weights_only=True)
    assert saved["state"]["stage"] == 2 and saved["strategy"]["consolidated"] == 2
    resumed = run(cfg, tmp_path / "crashed", resume=True)
    assert resumed["r_matrix"] == reference["r_matrix"]
    assert resumed["scores"] == reference["scores"]
    assert resumed["strategy"]["diagnostics"] == reference["strategy"]["diagnostics"]
