"""GEM: the dual QP against hand-solved cases, the constraints after projection, the step on a
module (trainable parameters only), its seeded memory, and digits runs through the runner."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import crash_at, tiny_config
from torch import nn

from clbench.data.datasets import ArrayDataset, make_loader
from clbench.plugins.build import check_init_args
from clbench.errors import UserError
from clbench.data.streams import Experience
from clbench.strategies.gem import GEM, project, solve_dual

if TYPE_CHECKING:
    from clbench.engine.module import ContinualModule


# -- the quadratic program -------------------------------------------------------------------
def test_dual_qp_matches_hand_solved_two_constraint_cases():
    # g conflicts with g1 only: the projection onto {z : z·g1 >= 0, z·g2 >= 0} is (0, 2), v = (1, 0).
    g = torch.tensor([-1.0, 2.0], dtype=torch.float64)
    memories = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    v = solve_dual((memories @ memories.T).numpy(), (memories @ g).numpy(), 0.0)
    np.testing.assert_allclose(v, [1.0, 0.0], atol=1e-8)
    torch.testing.assert_close(project(g, memories), torch.tensor([0.0, 2.0], dtype=torch.float64))
    # With the margin γ = 0.5 both duals sit on their bound: v = (0.5, 0.5), g̃ = (0, 2.5)
    # (the gradient of the dual there is (0, 2.5) >= 0, so the bound is optimal).
    v = solve_dual((memories @ memories.T).numpy(), (memories @ g).numpy(), 0.5)
    np.testing.assert_allclose(v, [0.5, 0.5], atol=1e-8)
    torch.testing.assert_close(project(g, memories, 0.5), torch.tensor([0.0, 2.5], dtype=torch.float64))
    # Both constraints violated: g = (-1, -1, 1) onto the first two axes' half-spaces is (0, 0, 1).
    g = torch.tensor([-1.0, -1.0, 1.0], dtype=torch.float64)
    memories = torch.eye(3, dtype=torch.float64)[:2]
    torch.testing.assert_close(project(g, memories), torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(project(g, memories, 0.5), torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))


def test_projection_leaves_no_constraint_violated_and_is_the_closest_point():
    gen = torch.Generator().manual_seed(0)
    projected_once = 0
    for trial in range(60):
        t, dim = [(2, 6), (5, 12), (8, 4)][trial % 3]  # the last: more constraints than dimensions
        g = torch.randn(dim, generator=gen, dtype=torch.float64)
        memories = torch.randn(t, dim, generator=gen, dtype=torch.float64)
        for margin in (0.0, 0.5):
            out = project(g, memories, margin)
            if not bool((memories @ g < 0).any()):
                assert out is g  # nothing to do: g itself
                continue
            projected_once += 1
            assert ((memories @ out) >= -1e-6).all(), memories @ out
            if margin == 0.0 and t <= dim:
                # KKT of the primal: g̃ − g = Gᵀv with v >= 0 and v_k (g̃·g_k) = 0.
                v = torch.linalg.lstsq(memories.T, out - g).solution
                torch.testing.assert_close(memories.T @ v, out - g)
                assert (v >= -1e-6).all() and (v * (memories @ out)).abs().max() < 1e-6
    assert projected_once > 40


def test_rank_deficient_memories_still_solve():
    g = torch.tensor([-1.0, 0.5, 0.0], dtype=torch.float64)
    row = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    memories = torch.stack([row, row, 2 * row, torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)])
    out = project(g, memories)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.5, 0.0], dtype=torch.float64))
    tiny = project(g * 1e-8, memories * 1e-8)  # scale-free: tiny gradients project the same way
    torch.testing.assert_close(tiny / 1e-8, out)


@pytest.mark.parametrize("norm", [1e-21, 1e-22])
@pytest.mark.parametrize("margin", [0.0, 0.5])
def test_a_saturated_memory_whose_squared_norm_is_below_float32s_range_still_projects_exactly(margin, norm):
    """A memory loss near 0 gives a gradient of norm 1e-21 or less: its squared norm is a float32
    denormal or 0, from which float32 products gave g̃ 43% off (1e-21) or infinite (1e-22)."""
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(4000, generator=gen)
    memory = torch.randn(4000, generator=gen)
    memory -= ((memory @ g) / (g @ g) + 0.5 * memory.norm() / g.norm()) * g  # cos(g, g_k) = -0.5 or so
    memory = (memory / memory.norm() * norm).float()
    assert float(memory @ memory) < torch.finfo(torch.float32).tiny  # the case: beyond float32's normal range
    g64, m64 = g.double(), memory.double()
    v = max(margin, float(-(m64 @ g64) / (m64 @ m64)))  # one constraint: the QP solved by hand
    out = project(g, memory[None], margin)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    torch.testing.assert_close(out, (g64 + v * m64).float(), rtol=1e-5, atol=1e-6)


# -- the step on a module ----------------------------------------------------------------------
def make_experience(position: int, n: int = 24, seed: int = 0) -> Experience:
    g = torch.Generator().manual_seed(seed + position)
    x = torch.randn(n, 4, generator=g) + position
    y = torch.randint(0, 4, (n,), generator=g)
    ds = ArrayDataset(x, y)
    return Experience(position=position, name=f"e{position}", domain_id=position, classes=[0, 1, 2, 3],
                      train=ds, test=ds)


def make_module(strategy) -> ContinualModule:
    from clbench.engine.module import ContinualModule  # Lightning: imported when a test needs it, not at collection

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))
    return ContinualModule(model, strategy, num_classes=4, num_columns=1,
                           optimizer=lambda params: torch.optim.SGD(params, lr=0.1))


def loader_factory(ds, **kw):
    return make_loader(ds, kw.pop("batch_size", 8), shuffle=True, seed=0, **kw)


def flat_memory_gradient(model, experience, rows) -> torch.Tensor:
    x, y = experience.train.x[rows], experience.train.y[rows]
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(F.cross_entropy(model(x), y), params)
    return torch.cat([g.flatten() for g in grads])


def test_gem_step_projects_trainable_gradients_against_every_past_memory():
    experiences = [make_experience(p) for p in range(3)]
    strategy = GEM(patterns_per_experience=10, memory_strength=0.0, memory_batch_size=4)
    module = make_module(strategy)
    strategy.setup(module.context, experiences, seed=0)
    strategy.adapt_model(module.context, 0)
    for exp in experiences[:2]:
        strategy.after_experience(module.context, exp)
    model = module.model
    model[0].weight.requires_grad_(False)  # a frozen weight: neither projected nor given a gradient
    strategy.adapt_model(module.context, experiences[2].position + 1)
    strategy.before_experience(module.context, experiences[2])
    strategy.train_loader(module.context, experiences[2].train, loader_factory)
    assert [sum(c for _, _, c in chunks) for chunks in strategy._chunks] == [10, 10]
    references = [flat_memory_gradient(model, experiences[p], strategy.memory[strategy.memory[:, 0] == p, 1])
                  for p in range(2)]
    trainable = [p for p in model.parameters() if p.requires_grad]
    projected = 0
    for _ in range(12):
        g = torch.randn(sum(p.numel() for p in trainable))
        start = 0
        for p in trainable:
            p.grad = g[start:start + p.numel()].view_as(p).clone()
            start += p.numel()
        strategy.before_optimizer_step(module.context, None)
        after = torch.cat([p.grad.flatten() for p in trainable])
        dots = [float(after @ r) for r in references]
        if min(float(g @ r) for r in references) < 0:
            projected += 1
            assert min(dots) > -1e-5 and min(abs(d) for d in dots) < 1e-4  # an active constraint
        else:
            assert torch.equal(after, g)
    assert model[0].weight.grad is None and 0 < projected == strategy.projections < 12


def test_gem_memory_is_seeded_per_experience_and_round_trips():
    experiences = [make_experience(p, n=30) for p in range(3)]
    strategy = GEM(patterns_per_experience=7)
    strategy.setup(None, experiences, seed=3)
    for exp in experiences:
        strategy.after_experience(None, exp)
    assert torch.bincount(strategy.memory[:, 0]).tolist() == [7, 7, 7]
    again = GEM(patterns_per_experience=7)
    again.setup(None, experiences, seed=3)
    for exp in experiences:
        again.after_experience(None, exp)
    assert torch.equal(again.memory, strategy.memory)
    buffer = io.BytesIO()
    torch.save(strategy.state_dict(), buffer)
    buffer.seek(0)
    restored = GEM(patterns_per_experience=7)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert torch.equal(restored.memory, strategy.memory)


def test_gem_rejects_bad_settings():
    for kwargs, field in [({"patterns_per_experience": -1}, "patterns_per_experience"),
                          ({"memory_strength": -0.1}, "memory_strength"), ({"memory_batch_size": 0}, "memory_batch_size")]:
        with pytest.raises(UserError) as err:
            check_init_args(GEM, kwargs, "strategy.init_args")
        assert err.value.where == f"strategy.init_args.{field}"


def test_gem_trains_through_lightning_with_memory():
    import lightning.pytorch as pl

    experiences = [make_experience(p) for p in range(2)]
    strategy = GEM(patterns_per_experience=8)
    module = make_module(strategy)
    strategy.setup(module.context, experiences, seed=0)
    strategy.adapt_model(module.context, 0)
    for exp in experiences:
        strategy.adapt_model(module.context, exp.position + 1)
        strategy.before_experience(module.context, exp)
        loader = strategy.train_loader(module.context, exp.train, loader_factory)
        pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False).fit(module, train_dataloaders=loader)
        strategy.after_experience(module.context, exp)
    assert strategy.projections > 0  # conflicts occurred on the second experience and were projected


# -- runs --------------------------------------------------------------------------------------
GEM_ARGS = {"class_path": "gem", "init_args": {"patterns_per_experience": 40, "memory_batch_size": 40}}


def test_gem_on_digits_differs_from_naive_and_forgets_less():
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    naive = run(resolve_config(tiny_config()), None, source="test")
    gem = run(resolve_config(tiny_config(strategy=GEM_ARGS)), None, source="test")
    assert gem["r_matrix"][0] == naive["r_matrix"][0]  # the first experience has no memory yet
    assert gem["r_matrix"] != naive["r_matrix"]
    assert gem["scores"]["bwt"] > naive["scores"]["bwt"]
    assert gem["strategy"]["params"] == {"patterns_per_experience": 40, "memory_strength": 0.5,
                                         "memory_batch_size": 40}


def test_gem_memory_survives_a_crash(tmp_path, monkeypatch):
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    cfg = resolve_config(tiny_config(strategy=GEM_ARGS, train={"epochs": 1, "batch_size": 32}))
    reference = run(cfg, tmp_path / "reference")
    crash_at(monkeypatch, "stage:2:step:5", cfg, tmp_path / "crashed")
    saved = torch.load(tmp_path / "crashed" / "checkpoint.pt", weights_only=True)
    assert saved["state"]["stage"] == 2 and torch.bincount(saved["strategy"]["memory"][:, 0]).tolist() == [40, 40]
    resumed = run(cfg, tmp_path / "crashed", resume=True)
    assert resumed["r_matrix"] == reference["r_matrix"]
    assert resumed["scores"] == reference["scores"]
