"""Memory Aware Synapses: the importance against hand-computed values (closed form on a linear
model, a per-sample loop, task heads), per-sample against per-batch gradients, accumulation,
the penalty, seeded subsets, state, and digits runs through the runner (crashed and resumed)."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import crash_at, make_experience, tiny_config, tiny_model
from test_strategies import make_module, roundtrip, set_params, train_experience
from torch import nn

from clbench.errors import UserError
from clbench.objectives.classification import Classification
from clbench.strategies.mas import MAS, output_importance


def per_sample_loop(model, ds, keep=None) -> dict[str, torch.Tensor]:
    """1/N Σ_n |∂ ‖F(x_n)‖² / ∂θ|, one backward pass per sample (eval mode)."""
    model.eval()
    out = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for i in range(len(ds)):
        x, y = ds[[i]]
        logits = model(x) if keep is None else model(x) * keep[y]
        model.zero_grad()
        logits.pow(2).sum().backward()
        for n, p in model.named_parameters():
            out[n] += p.grad.abs()
    return {n: v / len(ds) for n, v in out.items()}


# -- the importance --------------------------------------------------------------------------
def test_importance_of_a_linear_model_has_its_closed_form():
    """F = Wx + b: ∂‖F‖²/∂W_kd = 2 F_k x_d and ∂‖F‖²/∂b_k = 2 F_k, so Ω_W = mean_n |2 F_k x_d|."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    exp = make_experience(0, [0, 1, 2, 0, 1, 2, 1])
    x, _ = exp.train[list(range(7))]
    with torch.no_grad():
        f = model(x)
    omega = output_importance(model, exp.train, batch_size=3)
    torch.testing.assert_close(omega["weight"], (2 * f[:, :, None] * x[:, None, :]).abs().mean(0))
    torch.testing.assert_close(omega["bias"], (2 * f).abs().mean(0))


def test_importance_matches_a_per_sample_loop_and_is_per_sample_not_per_batch():
    """Per-sample magnitudes, the paper's Σ|g_n|/N; the reference code's per-batch default takes
    |Σ_n g_n|/N instead, never larger and smaller wherever samples pull opposite ways."""
    exp = make_experience(0, [0, 1, 2, 3, 1, 2, 0, 3, 3, 2, 1])
    model = tiny_model()
    omega = output_importance(model, exp.train, batch_size=4)
    expected = per_sample_loop(copy.deepcopy(model), exp.train)
    for n in expected:
        torch.testing.assert_close(omega[n], expected[n], rtol=1e-5, atol=1e-7)
    assert all(v.abs().sum() > 0 for v in omega.values())
    x, _ = exp.train[list(range(len(exp.train)))]
    model.zero_grad()
    model(x).pow(2).sum().backward()
    batched = {n: p.grad.abs() / len(x) for n, p in model.named_parameters()}
    smaller = 0.0
    for n in omega:
        assert (batched[n] <= omega[n] + 1e-6).all()
        smaller += (batched[n] < 0.9 * omega[n]).float().sum().item()
    assert smaller > 0.25 * sum(v.numel() for v in omega.values())  # not a rounding difference


def test_importance_is_deterministic_in_eval_mode_and_restores_the_mode():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 4))
    model(torch.randn(16, 4))  # running statistics away from their initial values
    exp = make_experience(0, [0, 1, 2, 3] * 3)
    model.train()
    a = output_importance(model, exp.train, batch_size=5)
    b = output_importance(model, exp.train, batch_size=12)
    assert model.training
    expected = per_sample_loop(copy.deepcopy(model), exp.train)
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(a[n], expected[n], rtol=1e-5, atol=1e-7)


def test_task_incremental_importance_counts_only_the_sample_task_logits():
    """With the objective's task mask (classes {0, 1} and {2, 3}), F is the sample's task head."""
    mask = torch.zeros(4, 4, dtype=torch.bool)
    mask[:2, :2] = mask[2:, 2:] = True
    objective = Classification()
    objective.task_mask = mask
    exp = make_experience(0, [0, 1, 2, 3, 3, 0, 1])
    model = tiny_model()
    omega = output_importance(model, exp.train, batch_size=3, objective=objective)
    expected = per_sample_loop(copy.deepcopy(model), exp.train, keep=mask.float())
    for n in expected:
        torch.testing.assert_close(omega[n], expected[n], rtol=1e-5, atol=1e-7)
    unmasked = output_importance(model, exp.train)
    assert not torch.allclose(omega["2.weight"], unmasked["2.weight"])
    # A row of the last layer only ever feeds other tasks' logits when no sample has its class.
    only_first = make_experience(0, [0, 1, 1, 0])
    omega = output_importance(model, only_first.train, objective=objective)
    assert omega["2.weight"][2:].abs().sum() == 0 and omega["2.weight"][:2].abs().sum() > 0


# -- the strategy ----------------------------------------------------------------------------
def test_importance_accumulates_over_experiences_around_the_latest_parameters():
    experiences = [make_experience(0, [0, 1, 2, 3] * 6), make_experience(1, [3, 2, 1, 0] * 6, seed=1)]
    strategy = MAS(mas_lambda=2.0)
    strategy.setup(None, experiences, 0)
    module = make_module(strategy)
    expected, trained = {}, {}
    for exp in experiences:
        train_experience(strategy, module, exp)
        trained = {n: p.detach().clone() for n, p in module.model.named_parameters()}
        omega = output_importance(copy.deepcopy(module.model), exp.train)
        expected = {n: expected.get(n, 0) + omega[n] for n in omega}
    for n in trained:
        torch.testing.assert_close(strategy.importance[n], expected[n], rtol=1e-5, atol=1e-7)
        assert torch.equal(strategy.anchor[n], trained[n])
    assert strategy.regulariser.consolidated == 2


def test_penalty_is_lambda_times_importance_weighted_squared_distance():
    model = tiny_model()
    strategy = MAS(mas_lambda=3.0)
    g = torch.Generator().manual_seed(0)
    omega = {n: torch.rand(p.shape, generator=g) for n, p in model.named_parameters()}
    anchor = {n: p.detach().clone() for n, p in model.named_parameters()}
    strategy.regulariser.consolidate(omega, anchor)
    direction = {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
    quad = sum((omega[n] * direction[n] ** 2).sum().item() for n in omega)
    module = make_module(strategy, model)
    loss = torch.tensor(0.5)
    for t in (0.0, 1.0, -2.0):
        set_params(model, {n: anchor[n] + t * direction[n] for n in anchor})
        assert strategy.penalty(model).item() == pytest.approx(t * t * quad, rel=1e-5, abs=1e-12)
        total = strategy.training_loss(module.context, None, None, None, loss).item()
        assert total == pytest.approx(0.5 + 3.0 * t * t * quad, rel=1e-5)  # λ·ΣΩ(θ−θ*)², no ½
    assert MAS().training_loss(module.context, None, None, None, loss) is loss  # nothing learnt yet


def test_samples_takes_a_seeded_subset():
    exp = make_experience(0, [0, 1, 2, 3] * 10)

    def importance(samples, seed):
        strategy = MAS(samples=samples)
        strategy.setup(None, [exp], seed)
        strategy.after_experience(make_module(strategy), exp)
        return torch.cat([t.flatten() for t in strategy.importance.values()])

    full = importance(None, 0)
    torch.testing.assert_close(full, importance(40, 0))  # as many as the split holds: all of it
    torch.testing.assert_close(full, torch.cat([t.flatten() for t in output_importance(tiny_model(),
                                                                                       exp.train).values()]))
    assert torch.equal(importance(5, 0), importance(5, 0))
    assert not torch.allclose(importance(5, 0), importance(5, 1))
    assert not torch.allclose(importance(5, 0), full)


def test_state_round_trips():
    experiences = [make_experience(0, [0, 1, 2, 3] * 4)]
    strategy = MAS(mas_lambda=1.5)
    strategy.setup(None, experiences, 0)
    module = make_module(strategy)
    train_experience(strategy, module, experiences[0])
    with torch.no_grad():
        for p in module.model.parameters():
            p.add_(0.1)
    restored = MAS(mas_lambda=1.5)
    restored.load_state_dict(roundtrip(strategy.state_dict()))
    assert restored.penalty(module.model).item() == pytest.approx(strategy.penalty(module.model).item(), rel=1e-6)
    assert restored.penalty(module.model).item() > 0


def test_mas_rejects_bad_settings():
    from clbench.plugins.build import check_init_args

    for args, field in [({"mas_lambda": -1.0}, "mas_lambda"), ({"samples": 0}, "samples"),
                        ({"importance_batch_size": 0}, "importance_batch_size")]:
        with pytest.raises(UserError) as err:
            check_init_args(MAS, args, "strategy.init_args")
        assert err.value.where == f"strategy.init_args.{field}"


# -- runs --------------------------------------------------------------------------------------
MAS_ARGS = {"class_path": "mas", "init_args": {"mas_lambda": 1.0, "samples": 300}}


def test_mas_runs_digits_and_a_crashed_run_resumes_to_the_same_result(tmp_path, monkeypatch):
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    cfg = resolve_config(tiny_config(strategy=MAS_ARGS, train={"epochs": 1, "batch_size": 32}))
    reference = run(cfg, tmp_path / "reference")
    assert reference["strategy"]["params"] == {"mas_lambda": 1.0, "samples": 300, "importance_batch_size": None}
    assert reference["r_matrix"][0][0] > 0.3  # well above chance (0.1)
    naive = run(resolve_config(tiny_config(train={"epochs": 1, "batch_size": 32})), None, source="test")
    assert naive["r_matrix"][0] == reference["r_matrix"][0]  # no penalty while learning the first
    assert naive["r_matrix"][1:] != reference["r_matrix"][1:]
    crash_at(monkeypatch, "stage:2:step:5", cfg, tmp_path / "crashed")
    saved = torch.load(tmp_path / "crashed" / "checkpoint.pt", weights_only=True)
    assert saved["state"]["stage"] == 2 and saved["strategy"]["consolidated"] == 2
    resumed = run(cfg, tmp_path / "crashed", resume=True)
    assert resumed["r_matrix"] == reference["r_matrix"]
    assert resumed["scores"] == reference["scores"]
