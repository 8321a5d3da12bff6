"""The classic strategies (replay, EWC, LwF, A-GEM): their rules, their bookkeeping, and runs."""

from __future__ import annotations

import copy
import io
from typing import TYPE_CHECKING

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from helpers import make_experience, tiny_model

from clbench.data.datasets import make_loader
from clbench.errors import UserError
from clbench.strategies.agem import AGEM, project
from clbench.strategies.ewc import EWC, diagonal_fisher
from clbench.strategies.lwf import LwF, distillation
from clbench.strategies.replay import Replay, balanced_quotas, reservoir_update

if TYPE_CHECKING:
    from clbench.engine.module import ContinualModule


# -- helpers ---------------------------------------------------------------------------------
def make_module(strategy, model=None, lr: float = 0.1) -> ContinualModule:
    from clbench.engine.module import ContinualModule  # Lightning: imported when a test needs it, not at collection

    model = model if model is not None else tiny_model()
    return ContinualModule(model, strategy, num_classes=4, num_columns=1,
                           optimizer=lambda params: torch.optim.SGD(params, lr=lr))


def loader_factory(batch_size: int = 8):
    def factory(ds, **kw):
        return make_loader(ds, kw.pop("batch_size", batch_size), shuffle=True, seed=kw.pop("seed", 0), **kw)
    return factory


def is_combined(loader) -> bool:
    """Whether a strategy's train loader pairs each batch with a memory batch (Lightning's CombinedLoader)."""
    from lightning.pytorch.utilities import CombinedLoader

    return isinstance(loader, CombinedLoader)


def fit(module, loader, epochs: int = 1) -> None:
    import lightning.pytorch as pl

    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, train_dataloaders=loader)


def train_experience(strategy, module, exp, batch_size: int = 8, epochs: int = 1):
    strategy.adapt_model(module.context, exp.position + 1)
    strategy.before_experience(module.context, exp)
    loader = strategy.train_loader(module.context, strategy.train_dataset(exp), loader_factory(batch_size))
    fit(module, loader, epochs)
    strategy.after_experience(module.context, exp)
    return loader


def roundtrip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def grads_of(model) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


# -- replay: the buffer ----------------------------------------------------------------------
def test_reservoir_keeps_every_item_with_equal_probability():
    """Streaming 60 items in uneven chunks into 12 slots keeps each with probability 12/60."""
    capacity, chunks, trials = 12, [7, 25, 28], 3000
    total = sum(chunks)
    hits = torch.zeros(total)
    for t in range(trials):
        g = torch.Generator().manual_seed(t)
        buffer, seen = torch.zeros(0, dtype=torch.long), 0
        for n in chunks:
            buffer = reservoir_update(buffer, seen, torch.arange(seen, seen + n), capacity, g)
            seen += n
            assert len(buffer) == min(capacity, seen)
            assert len(torch.unique(buffer)) == len(buffer)
        hits[buffer] += 1
    freq = hits / trials
    expected = capacity / total
    sigma = (expected * (1 - expected) / trials) ** 0.5
    assert (freq - expected).abs().max() < 5 * sigma
    # Early and late items alike: the mean frequency of each chunk matches too.
    assert abs(freq[:7].mean() - expected) < 3 * sigma and abs(freq[-28:].mean() - expected) < 3 * sigma
    chi2 = ((hits - trials * expected) ** 2 / (trials * expected * (1 - expected))).sum()
    assert chi2 < total + 5 * (2 * total) ** 0.5


def test_reservoir_fills_before_replacing():
    g = torch.Generator().manual_seed(0)
    buffer = reservoir_update(torch.zeros(0, dtype=torch.long), 0, torch.arange(5), 8, g)
    assert buffer.tolist() == [0, 1, 2, 3, 4]
    buffer = reservoir_update(buffer, 5, torch.arange(5, 8), 8, g)
    assert buffer.tolist() == list(range(8))


def test_replay_reservoir_memory_is_proportional_to_experience_sizes():
    sizes = [30, 90, 60]
    experiences = [make_experience(p, [0] * n) for p, n in enumerate(sizes)]
    share = torch.zeros(len(sizes))
    trials = 400
    for seed in range(trials):
        strategy = Replay(mem_size=20)
        strategy.setup(None, experiences, seed)
        for exp in experiences:
            strategy.after_experience(None, exp)
        assert len(strategy.buffer) == 20 and strategy.seen == sum(sizes)
        assert len({tuple(r) for r in strategy.buffer.tolist()}) == 20
        for pos, idx in strategy.buffer.tolist():
            assert 0 <= idx < sizes[pos]
        share += torch.bincount(strategy.buffer[:, 0], minlength=len(sizes)).float() / 20
    share /= trials
    expected = torch.tensor(sizes, dtype=torch.float) / sum(sizes)
    assert torch.allclose(share, expected, atol=0.02)


def test_replay_buffer_is_seeded():
    experiences = [make_experience(p, [p % 4] * 50) for p in range(3)]

    def buffer(seed):
        strategy = Replay(mem_size=16)
        strategy.setup(None, experiences, seed)
        for exp in experiences:
            strategy.after_experience(None, exp)
        return strategy.buffer

    assert torch.equal(buffer(3), buffer(3))
    assert not torch.equal(buffer(3), buffer(4))


def test_class_balanced_memory_has_equal_slots_per_class():
    experiences = [make_experience(0, [0] * 30 + [1] * 50), make_experience(1, [2] * 40 + [3] * 25),
                   make_experience(2, [0, 1, 2, 3] * 10)]
    strategy = Replay(mem_size=40, policy="class_balanced")
    strategy.setup(None, experiences, 0)
    expected = [{0: 20, 1: 20}, {0: 10, 1: 10, 2: 10, 3: 10}, {0: 10, 1: 10, 2: 10, 3: 10}]
    for exp, counts in zip(experiences, expected):
        strategy.after_experience(None, exp)
        got = dict(zip(*[t.tolist() for t in torch.unique(strategy.labels, return_counts=True)]))
        assert got == counts
        # The stored labels are those of the samples the pairs point at.
        for (pos, idx), label in zip(strategy.buffer.tolist(), strategy.labels.tolist()):
            assert experiences[pos].train.y[idx].item() == label


def test_class_balanced_gives_a_rare_class_all_it_has():
    assert balanced_quotas(10, {0: 2, 1: 50, 2: 50}) == {0: 2, 1: 4, 2: 4}
    assert balanced_quotas(11, {0: 50, 1: 50, 2: 50}) == {0: 4, 1: 4, 2: 3}
    assert balanced_quotas(10, {0: 3, 1: 2}) == {0: 3, 1: 2}
    exp = make_experience(0, [0] * 3 + [1] * 40 + [2] * 40)
    strategy = Replay(mem_size=21, policy="class_balanced")
    strategy.setup(None, [exp], 0)
    strategy.after_experience(None, exp)
    assert torch.bincount(strategy.labels).tolist() == [3, 9, 9]


def test_class_balanced_keeps_a_uniform_sample_within_a_class():
    """Class 0 appears in two experiences (20 then 60 samples): 3/4 of its slots hold the later ones."""
    experiences = [make_experience(0, [0] * 20 + [1] * 20), make_experience(1, [0] * 60 + [1] * 20)]
    from_second = 0.0
    trials = 300
    for seed in range(trials):
        strategy = Replay(mem_size=16, policy="class_balanced")
        strategy.setup(None, experiences, seed)
        for exp in experiences:
            strategy.after_experience(None, exp)
        rows = strategy.buffer[strategy.labels == 0]
        assert len(rows) == 8
        from_second += (rows[:, 0] == 1).float().mean().item()
    assert abs(from_second / trials - 0.75) < 0.03


def test_replay_rejects_bad_settings():
    """Ranges are declared in the signature and checked from the config (clbench.config.validation)."""
    from clbench.plugins.build import check_init_args

    with pytest.raises(UserError, match=r"strategy.init_args.mem_size: mem_size must be >= 0, got -1"):
        check_init_args(Replay, {"mem_size": -1}, "strategy.init_args")
    with pytest.raises(UserError, match="strategy.init_args.policy: expected one of 'reservoir', 'class_balanced'"):
        check_init_args(Replay, {"policy": "fifo"}, "strategy.init_args")


# -- replay: training ------------------------------------------------------------------------
class Recording(Replay):
    def prepare_batch(self, ctx, batch):
        x, y = super().prepare_batch(ctx, batch)
        self.batches.append((isinstance(batch, dict), x.detach().clone()))
        return x, y


def test_replay_concatenates_a_memory_batch_to_every_step():
    experiences = [make_experience(0, [0, 1, 2, 3] * 10), make_experience(1, [0, 1, 2, 3] * 12)]
    strategy = Recording(mem_size=10, replay_batch_size=5)
    strategy.batches = []
    strategy.setup(None, experiences, 0)
    module = make_module(strategy)
    first = train_experience(strategy, module, experiences[0])
    assert not is_combined(first)
    assert all(not combined for combined, _ in strategy.batches)
    strategy.batches = []
    memory = {tuple(r) for r in strategy.buffer.tolist()}
    assert len(memory) == 10
    second = train_experience(strategy, module, experiences[1])
    assert is_combined(second)
    assert len(strategy.batches) == 6  # 48 samples in batches of 8: the memory never runs out first
    for combined, x in strategy.batches:
        assert combined and len(x) == 8 + 5
        assert (x[:8, 0] == 1).all()                   # the current experience first
        for pos, idx in x[8:, :2].long().tolist():     # then samples from the memory
            assert (pos, idx) in memory


def test_replay_batch_size_defaults_to_the_training_batch_size():
    experiences = [make_experience(0, [0, 1] * 20), make_experience(1, [2, 3] * 20)]
    strategy = Recording(mem_size=10)
    strategy.batches = []
    strategy.setup(None, experiences, 0)
    module = make_module(strategy)
    train_experience(strategy, module, experiences[0], batch_size=4)
    strategy.batches = []
    strategy.adapt_model(module.context, experiences[1].position + 1)
    strategy.before_experience(module.context, experiences[1])
    loader = strategy.train_loader(module.context, experiences[1].train, loader_factory(4))
    fit(module, loader)
    assert {len(x) for _, x in strategy.batches} == {8}


def test_replay_state_round_trips():
    experiences = [make_experience(p, [0, 1, 2, 3] * 8) for p in range(3)]
    for policy in ("reservoir", "class_balanced"):
        strategy = Replay(mem_size=12, policy=policy)
        strategy.setup(None, experiences, 7)
        for exp in experiences[:2]:
            strategy.after_experience(None, exp)
        restored = Replay(mem_size=12, policy=policy)
        restored.setup(None, experiences, 7)
        restored.load_state_dict(roundtrip(strategy.state_dict()))
        assert torch.equal(restored.buffer, strategy.buffer) and restored.seen == strategy.seen
        strategy.after_experience(None, experiences[2])
        restored.after_experience(None, experiences[2])
        assert torch.equal(restored.buffer, strategy.buffer)


# -- EWC -------------------------------------------------------------------------------------
def brute_force_fisher(model, ds) -> list[torch.Tensor]:
    model.eval()
    out = [torch.zeros_like(p) for p in model.parameters()]
    for i in range(len(ds)):
        x, y = ds[[i]]
        model.zero_grad()
        (-F.log_softmax(model(x), dim=1)[0, y[0]]).backward()
        for acc, p in zip(out, model.parameters()):
            acc += p.grad ** 2
    return [o / len(ds) for o in out]


def test_fisher_matches_a_per_sample_loop():
    exp = make_experience(0, [0, 1, 2, 3, 1, 2, 0, 3, 3, 2, 1])
    model = tiny_model()
    fisher = diagonal_fisher(model, exp.train, batch_size=4)
    expected = brute_force_fisher(copy.deepcopy(model), exp.train)
    for (name, f), e in zip(fisher.items(), expected):
        assert torch.allclose(f, e, rtol=1e-5, atol=1e-8), name
    assert all(f.abs().sum() > 0 for f in fisher.values())


@pytest.mark.parametrize("frozen_first", [False, True])
def test_linear_layers_take_the_factored_path_and_match_the_per_sample_one(monkeypatch, frozen_first):
    """An MLP's Fisher (EWC) and output importance (MAS) come from (|δ|^p)ᵀ|a|^p per layer, one
    backward per chunk; they equal the per-sample (vmap) sums, and a model with any other
    trainable layer (here a 1-d convolution) takes the per-sample path."""
    from clbench.strategies import ewc, mas

    exp = make_experience(0, [0, 1, 2, 3, 1, 2, 0, 3, 3, 2, 1], dim=6)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))
    if frozen_first:
        model[0].requires_grad_(False)  # a frozen layer is no obstacle: only trainable tensors count
    taken = []
    real = ewc.linear_gradient_moments

    def spy(*args, **kwargs):
        taken.append(real(*args, **kwargs))
        return taken[-1]

    monkeypatch.setattr(ewc, "linear_gradient_moments", spy)
    monkeypatch.setattr(mas, "linear_gradient_moments", spy)
    fast = (ewc.diagonal_fisher(model, exp.train, batch_size=4), mas.output_importance(model, exp.train, batch_size=4))
    assert taken and all(taken)
    for module in (ewc, mas):
        monkeypatch.setattr(module, "linear_gradient_moments", lambda *a, **k: False)
    slow = (ewc.diagonal_fisher(model, exp.train, batch_size=4), mas.output_importance(model, exp.train, batch_size=4))
    for a, b in zip(fast, slow):
        assert a.keys() == b.keys() and len(a) == (4 if frozen_first else 6)
        for name in a:
            assert torch.allclose(a[name], b[name], rtol=1e-5, atol=1e-9), name
        assert all(v.abs().sum() > 0 for v in a.values())
    taken.clear()
    for module in (ewc, mas):
        monkeypatch.setattr(module, "linear_gradient_moments", spy)
    conv = nn.Sequential(nn.Unflatten(1, (1, 6)), nn.Conv1d(1, 2, 3), nn.Flatten(), nn.Linear(8, 4))
    assert ewc.diagonal_fisher(conv, exp.train, batch_size=4).keys() == {n for n, _ in conv.named_parameters()}
    assert taken and not any(taken)


def test_fisher_uses_eval_mode_and_restores_the_mode():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 4))
    model(torch.randn(16, 4))  # running statistics away from their initial values
    exp = make_experience(0, [0, 1, 2, 3] * 3)
    model.train()
    a = diagonal_fisher(model, exp.train, batch_size=5)
    b = diagonal_fisher(model, exp.train, batch_size=12)
    assert model.training
    for n in a:
        assert torch.allclose(a[n], b[n], atol=1e-7)
    expected = brute_force_fisher(copy.deepcopy(model), exp.train)
    for f, e in zip(a.values(), expected):
        assert torch.allclose(f, e, rtol=1e-5, atol=1e-8)


def consolidated_ewc(mode="separate", gamma=1.0, lam=2.0):
    strategy = EWC(ewc_lambda=lam, mode=mode, gamma=gamma)
    model = tiny_model()
    names = [n for n, _ in model.named_parameters()]
    g = torch.Generator().manual_seed(1)
    history = []
    for _ in range(3):
        fisher = {n: torch.rand(p.shape, generator=g) * (torch.rand(p.shape, generator=g) > 0.3)
                  for n, p in model.named_parameters()}
        theta = {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
        strategy.consolidate(fisher, theta)
        history.append((fisher, theta))
    return strategy, model, names, history


def set_params(model, values: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(values[n])


def test_ewc_penalty_is_zero_at_the_anchor_and_quadratic_around_it():
    strategy = EWC(ewc_lambda=3.0)
    model = tiny_model()
    g = torch.Generator().manual_seed(0)
    fisher = {n: torch.rand(p.shape, generator=g) for n, p in model.named_parameters()}
    anchor = {n: p.detach().clone() for n, p in model.named_parameters()}
    direction = {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
    strategy.consolidate(fisher, anchor)
    values = []
    for t in (0.0, 1.0, 2.0, -3.0):
        set_params(model, {n: anchor[n] + t * direction[n] for n in anchor})
        values.append(strategy.penalty(model).item())
    quad = sum((fisher[n] * direction[n] ** 2).sum().item() for n in anchor)
    assert values[0] == 0.0
    assert values[1] == pytest.approx(quad, rel=1e-5)
    assert values[2] == pytest.approx(4 * quad, rel=1e-5)
    assert values[3] == pytest.approx(9 * quad, rel=1e-5)
    loss = torch.tensor(0.25)
    total = strategy.training_loss(make_module(strategy, model), None, None, None, loss)
    assert total.item() == pytest.approx(0.25 + 1.5 * 9 * quad, rel=1e-5)


def test_ewc_separate_equals_one_penalty_per_experience():
    strategy, model, names, history = consolidated_ewc("separate")
    assert strategy.consolidated == 3
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        point = {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
        set_params(model, point)
        expected = sum((f[n] * (point[n] - th[n]) ** 2).sum() for f, th in history for n in names)
        assert strategy.penalty(model).item() == pytest.approx(expected.item(), rel=1e-5)
    # The penalty's gradient is that of the sum of separate penalties too.
    model.zero_grad()
    strategy.penalty(model).backward()
    for n, p in model.named_parameters():
        expected = sum(2 * f[n] * (p.detach() - th[n]) for f, th in history)
        assert torch.allclose(p.grad, expected, rtol=1e-4, atol=1e-5)


def test_ewc_online_decays_the_fisher_and_anchors_at_the_latest_parameters():
    strategy, model, names, history = consolidated_ewc("online", gamma=0.5)
    (f1, _), (f2, _), (f3, t3) = history
    for n in names:
        assert torch.allclose(strategy.importance[n], 0.25 * f1[n] + 0.5 * f2[n] + f3[n])
        assert torch.equal(strategy.anchor[n], t3[n])
    assert strategy.offset == 0.0
    point = {n: torch.randn(p.shape) for n, p in model.named_parameters()}
    set_params(model, point)
    expected = sum(((0.25 * f1[n] + 0.5 * f2[n] + f3[n]) * (point[n] - t3[n]) ** 2).sum() for n in names)
    assert strategy.penalty(model).item() == pytest.approx(expected.item(), rel=1e-5)


def test_ewc_after_experience_estimates_the_fisher_at_the_trained_parameters():
    experiences = [make_experience(0, [0, 1, 2, 3] * 6), make_experience(1, [0, 1, 2, 3] * 6)]
    strategy = EWC(ewc_lambda=10.0)
    strategy.setup(None, experiences, 0)
    module = make_module(strategy)
    train_experience(strategy, module, experiences[0])
    trained = {n: p.detach().clone() for n, p in module.model.named_parameters()}
    expected = diagonal_fisher(module.model, experiences[0].train)
    for n in trained:
        assert torch.equal(strategy.anchor[n], trained[n])
        assert torch.allclose(strategy.importance[n], expected[n])
    loader = strategy.train_loader(module.context, experiences[1].train, loader_factory())
    strategy.adapt_model(module.context, experiences[1].position + 1)
    strategy.before_experience(module.context, experiences[1])
    fit(module, loader)
    moved = sum((p.detach() - trained[n]).abs().sum() for n, p in module.model.named_parameters())
    assert moved > 0 and strategy.penalty(module.model).item() > 0


def test_ewc_fisher_samples_uses_a_seeded_subset():
    exp = make_experience(0, [0, 1, 2, 3] * 10)

    def importance(samples, seed):
        strategy = EWC(fisher_samples=samples)
        strategy.setup(None, [exp], seed)
        strategy.after_experience(make_module(strategy), exp)
        return torch.cat([t.flatten() for t in strategy.importance.values()])

    full = importance(None, 0)
    assert torch.allclose(full, importance(40, 0))  # as many as the split holds: all of it
    assert torch.equal(importance(5, 0), importance(5, 0))
    assert not torch.allclose(importance(5, 0), importance(5, 1))
    assert not torch.allclose(importance(5, 0), full)


def test_ewc_automatic_chunks_shrink_with_the_model(monkeypatch):
    import clbench.strategies.ewc as ewc_module

    exp = make_experience(0, [0, 1, 2, 3] * 10)
    chunks = []
    real = ewc_module.diagonal_fisher

    def spy(model, dataset, *, batch_size, device, **kw):
        chunks.append(batch_size)
        return real(model, dataset, batch_size=batch_size, device=device, **kw)

    monkeypatch.setattr(ewc_module, "diagonal_fisher", spy)
    results = []
    for budget in (2**28, 76 * 7):  # the tiny model has 76 parameters
        monkeypatch.setattr(ewc_module, "_CHUNK_BUDGET", budget)
        strategy = EWC()
        strategy.setup(None, [exp], 0)
        strategy.after_experience(make_module(strategy), exp)
        results.append(strategy.importance)
    assert chunks == [256, 7]
    assert all(torch.allclose(results[0][n], results[1][n], atol=1e-7) for n in results[0])


def test_ewc_state_round_trips():
    strategy, model, names, _ = consolidated_ewc("separate")
    restored = EWC(ewc_lambda=2.0)
    restored.load_state_dict(roundtrip(strategy.state_dict()))
    assert restored.consolidated == 3
    assert restored.penalty(model).item() == pytest.approx(strategy.penalty(model).item(), rel=1e-6)


def test_ewc_rejects_bad_settings():
    from clbench.plugins.build import check_init_args

    for args, field in [({"mode": "both"}, "mode"), ({"gamma": 1.5}, "gamma"), ({"ewc_lambda": -1.0}, "ewc_lambda"),
                        ({"fisher_samples": 0}, "fisher_samples")]:
        with pytest.raises(UserError) as err:
            check_init_args(EWC, args, "strategy.init_args")
        assert err.value.where == f"strategy.init_args.{field}"


# -- LwF -------------------------------------------------------------------------------------
def test_distillation_is_the_kl_divergence_of_softened_outputs():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    p_t, p_s = F.softmax(t / 2, dim=1), F.softmax(s / 2, dim=1)
    expected = (p_t * (p_t.log() - p_s.log())).sum(1).mean()
    assert distillation(s, t, 2.0).item() == pytest.approx(expected.item(), rel=1e-5)
    assert distillation(t, t, 2.0).abs().item() < 1e-6


def test_lwf_adds_nothing_while_the_student_equals_the_teacher():
    experiences = [make_experience(0, [0, 1, 2, 3] * 4), make_experience(1, [0, 1, 2, 3] * 4)]
    strategy = LwF(alpha=1.0, temperature=2.0)
    strategy.setup(None, experiences, 0)
    module = make_module(strategy)
    strategy.adapt_model(module.context, experiences[0].position + 1)
    strategy.before_experience(module.context, experiences[0])
    x, y = experiences[1].train[list(range(8))]
    logits = module.model(x)
    loss = F.cross_entropy(logits, y)
    assert strategy.training_loss(module.context, x, y, logits, loss) is loss  # no teacher on the first experience
    strategy.adapt_model(module.context, experiences[1].position + 1)
    strategy.before_experience(module.context, experiences[1])
    total = strategy.training_loss(module.context, x, y, logits, loss)
    assert total.item() == pytest.approx(loss.item(), abs=1e-6)
    with torch.no_grad():
        module.model[0].weight.add_(0.5)
    logits = module.model(x)
    loss = F.cross_entropy(logits, y)
    with torch.no_grad():
        teacher_logits = strategy.teacher(x)
    total = strategy.training_loss(module.context, x, y, logits, loss)
    kd = distillation(logits, teacher_logits, 2.0)
    assert kd.item() > 0
    assert total.item() == pytest.approx(loss.item() + kd.item(), rel=1e-6)


def test_lwf_teacher_stays_frozen_while_the_student_trains():
    experiences = [make_experience(0, [0, 1, 2, 3] * 6), make_experience(1, [3, 2, 1, 0] * 6)]
    strategy = LwF(alpha=0.5)
    strategy.setup(None, experiences, 0)
    module = make_module(strategy)
    train_experience(strategy, module, experiences[0])
    after_first = copy.deepcopy(module.model.state_dict())
    train_experience(strategy, module, experiences[1])
    teacher = strategy.teacher.state_dict()
    assert all(torch.equal(teacher[k], after_first[k]) for k in after_first)
    assert any(not torch.equal(module.model.state_dict()[k], after_first[k]) for k in after_first)
    assert not any(p.requires_grad for p in strategy.teacher.parameters())
    assert not strategy.teacher.training


def test_lwf_state_round_trips_the_teacher():
    experiences = [make_experience(0, [0, 1, 2, 3] * 4), make_experience(1, [0, 1, 2, 3] * 4)]
    strategy = LwF()
    strategy.setup(None, experiences, 0)
    module = make_module(strategy)
    strategy.adapt_model(module.context, experiences[1].position + 1)
    strategy.before_experience(module.context, experiences[1])
    saved = copy.deepcopy(strategy.teacher.state_dict())
    state = roundtrip(strategy.state_dict())
    with torch.no_grad():  # training moved on before the crash
        for p in module.model.parameters():
            p.add_(1.0)
    restored = LwF()
    restored.setup(None, experiences, 0)
    restored.load_state_dict(state)
    restored.before_experience(module.context, experiences[1])  # resumed inside experience 1
    assert all(torch.equal(restored.teacher.state_dict()[k], v) for k, v in saved.items())
    later = make_experience(2, [0, 1])
    restored.before_experience(module.context, later)  # a new experience takes a fresh snapshot
    assert all(torch.equal(restored.teacher.state_dict()[k], v) for k, v in module.model.state_dict().items())


# -- A-GEM -----------------------------------------------------------------------------------
def test_projection_removes_only_the_conflicting_component():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        grads = [torch.randn(3, 4, generator=g), torch.randn(5, generator=g)]
        ref = [torch.randn(3, 4, generator=g), torch.randn(5, generator=g)]
        flat_g = torch.cat([t.flatten() for t in grads])
        flat_r = torch.cat([t.flatten() for t in ref])
        before = [t.clone() for t in grads]
        dot = project(grads, ref)
        after = torch.cat([t.flatten() for t in grads])
        assert dot.item() == pytest.approx((flat_g @ flat_r).item(), rel=1e-5)
        if dot < 0:
            assert (after @ flat_r).item() == pytest.approx(0.0, abs=1e-5)
            assert torch.allclose(after, flat_g - (flat_g @ flat_r) / (flat_r @ flat_r) * flat_r, atol=1e-6)
        else:
            assert all(torch.equal(a, b) for a, b in zip(grads, before))
        assert (after @ flat_r).item() >= -1e-5


def reference_gradient(model, x, y) -> torch.Tensor:
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def test_agem_step_projects_against_the_memory_gradient():
    strategy = AGEM()
    module = make_module(strategy)
    model = module.model
    g = torch.Generator().manual_seed(0)
    conflicts = 0
    for trial in range(10):
        x, y = torch.randn(8, 4, generator=g), torch.randint(0, 4, (8,), generator=g)
        xm, ym = torch.randn(8, 4, generator=g), torch.randint(0, 4, (8,), generator=g)
        g_ref = reference_gradient(model, xm, ym)
        g_cur = reference_gradient(model, x, y)
        batch = strategy.prepare_batch(module.context, {"current": (x, y), "memory": (xm, ym)})
        assert batch[0] is x
        strategy.before_optimizer_step(module.context, None)
        after = torch.cat([p.grad.flatten() for p in model.parameters()])
        if g_cur @ g_ref < 0:
            conflicts += 1
            assert (after @ g_ref).item() == pytest.approx(0.0, abs=1e-5)
        else:
            assert torch.equal(after, g_cur)
        assert strategy._memory_batch is None
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    assert 0 < conflicts < 10
    # The memory batch equal to the current one: g·g_ref = |g|² >= 0, nothing changes.
    g_cur = reference_gradient(model, x, y)
    strategy.prepare_batch(module.context, {"current": (x, y), "memory": (x, y)})
    strategy.before_optimizer_step(module.context, None)
    assert torch.allclose(torch.cat([p.grad.flatten() for p in model.parameters()]), g_cur)


def test_agem_memory_holds_a_seeded_sample_per_experience():
    experiences = [make_experience(p, [0, 1, 2, 3] * 10) for p in range(3)]
    strategy = AGEM(patterns_per_experience=7)
    strategy.setup(None, experiences, 0)
    for exp in experiences:
        strategy.after_experience(None, exp)
    assert torch.bincount(strategy.memory[:, 0]).tolist() == [7, 7, 7]
    assert len({tuple(r) for r in strategy.memory.tolist()}) == 21
    small = make_experience(3, [0, 1, 2])
    strategy.experiences.append(small)
    strategy.after_experience(None, small)
    assert (strategy.memory[:, 0] == 3).sum() == 3
    restored = AGEM(patterns_per_experience=7)
    restored.load_state_dict(roundtrip(strategy.state_dict()))
    assert torch.equal(restored.memory, strategy.memory)


def test_agem_trains_with_a_memory_batch_every_step():
    experiences = [make_experience(0, [0, 1, 2, 3] * 8), make_experience(1, [3, 2, 1, 0] * 8)]

    class Counting(AGEM):
        steps = 0

        def before_optimizer_step(self, ctx, optimizer):
            if self._memory_batch is not None:
                Counting.steps += 1
                assert len(self._memory_batch[0]) == 5 and (self._memory_batch[0][:, 0] == 0).all()
            super().before_optimizer_step(ctx, optimizer)

    strategy = Counting(patterns_per_experience=6, sample_size=5)
    strategy.setup(None, experiences, 0)
    module = make_module(strategy)
    first = train_experience(strategy, module, experiences[0])
    assert not is_combined(first) and Counting.steps == 0
    second = train_experience(strategy, module, experiences[1])
    assert is_combined(second) and Counting.steps == 4


# -- end to end ------------------------------------------------------------------------------
def run_digits(strategy: str, init_args: dict | None = None, epochs: int = 1, seed: int = 0,
               domains: list[str] | None = None, hidden: int = 256) -> dict:
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    benchmark = {"class_path": "digits-domains", "init_args": {"domains": domains} if domains else {}}
    cfg = resolve_config({"seed": seed, "benchmark": benchmark,
                          "model": {"class_path": "mlp", "init_args": {"hidden": hidden}},
                          "strategy": {"class_path": strategy, "init_args": init_args or {}},
                          "train": {"epochs": epochs}, "logging": {"tensorboard": False, "progress": False}})
    return run(cfg, None, source="test")


THREE_DOMAINS = ["rot0", "rot90", "invert"]
BASES = {"replay": Replay, "ewc": EWC, "lwf": LwF, "agem": AGEM}


def check_digits_result(result: dict, name: str, args: dict) -> None:
    r = result["r_matrix"]
    assert result["experiences"] == THREE_DOMAINS
    assert len(r) == 3 and all(len(row) == 3 for row in r)
    assert all(0.0 <= v <= 1.0 for row in r for v in row)
    assert r[0][0] > 0.3  # well above chance (0.1) on the first domain after one epoch
    assert result["strategy"]["params"] == {**BASES[name]().hparams(), **args}  # every hyper-parameter recorded


@pytest.mark.parametrize("name,args", [("replay", {"mem_size": 100}), ("ewc", {"mode": "online", "gamma": 0.9})])
def test_strategies_run_a_digits_stream(name, args):
    check_digits_result(run_digits(name, args, domains=THREE_DOMAINS, hidden=64), name, args)


class Interrupted(RuntimeError):
    pass


@pytest.mark.parametrize("name,args", [("replay", {"mem_size": 50, "policy": "class_balanced"}), ("ewc", {}),
                                       ("lwf", {}), ("agem", {"patterns_per_experience": 30, "sample_size": 16})])
def test_a_resumed_run_matches_an_uninterrupted_one(name, args, tmp_path):
    """Each strategy runs a digits stream, and the strategy state in the checkpoint is all a
    run needs to continue exactly after an interruption."""
    from clbench import registry
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    base = BASES[name]
    crash = {"at": None}

    class Crashing(base):
        def before_experience(self, ctx, experience):
            if experience.position == crash["at"]:
                raise Interrupted
            super().before_experience(ctx, experience)

    registry.register("strategies", f"crashing-{name}")(Crashing)
    cfg = resolve_config({"benchmark": {"class_path": "digits-domains", "init_args": {"domains": THREE_DOMAINS}},
                          "model": {"class_path": "mlp", "init_args": {"hidden": 64}},
                          "strategy": {"class_path": f"crashing-{name}", "init_args": args},
                          "train": {"epochs": 1}, "logging": {"tensorboard": False, "progress": False}})
    whole = run(cfg, None, source="test")
    check_digits_result(whole, name, args)
    crash["at"] = 2
    # a plugin hook that raises reaches the caller as a UserError naming the hook (clbench.plugins.hooks)
    with pytest.raises(UserError, match="Interrupted"):
        run(cfg, tmp_path, source="test")
    assert (tmp_path / "checkpoint.pt").exists()
    crash["at"] = None
    resumed = run(cfg, tmp_path, source="test", resume=True)
    assert resumed["r_matrix"] == whole["r_matrix"]


@pytest.mark.slow
def test_replay_forgets_less_than_naive():
    naive = run_digits("naive", epochs=3)
    replay = run_digits("replay", {"mem_size": 200}, epochs=3)
    assert replay["scores"]["acc"] > naive["scores"]["acc"] + 0.05
    assert replay["scores"]["bwt"] > naive["scores"]["bwt"]
