"""GDumb: the greedy class-balanced sampler, training from the initial weights on the memory alone, runs."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import crash_at, make_experience, tiny_config

from clbench.errors import UserError
from clbench.strategies.gdumb import BalancedMemory, GDumb

from test_strategies import make_module, roundtrip, train_experience


def counts(labels) -> dict[int, int]:
    return dict(zip(*[t.tolist() for t in torch.unique(torch.as_tensor(labels), return_counts=True)]))


# -- the sampler -----------------------------------------------------------------------------
def test_every_offer_follows_the_greedy_rule():
    """Stored while there is room; once full, stored only if its class holds fewer than
    capacity / |classes seen|, evicting an item of a largest class; the size never exceeds it."""
    g = torch.Generator().manual_seed(0)
    weights = torch.tensor([8.0, 1.0, 4.0, 0.5, 2.0])
    memory = BalancedMemory(12, torch.zeros((0, 2), dtype=torch.long), torch.zeros(0, dtype=torch.long), [])
    rejected = evicted = 0
    for i in range(400):
        y = int(torch.multinomial(weights, 1, generator=g))
        before = counts(memory.labels)
        seen = memory.seen | {y}
        full = len(memory.items) == 12
        slot = memory.offer((0, i), y, g)
        after = counts(memory.labels)
        assert len(memory.items) == min(12, i + 1)
        if not full:
            assert slot is None and memory.items[-1] == (0, i)
        elif before.get(y, 0) >= 12 / len(seen):
            assert slot is None and after == before
            rejected += 1
        else:
            loser = [c for c in before if after.get(c, 0) == before[c] - 1]
            assert len(loser) == 1 and before[loser[0]] == max(before.values())
            assert memory.items[slot] == (0, i) and after[y] == before.get(y, 0) + 1
            evicted += 1
    assert rejected > 100 and evicted > 10
    final = counts(memory.labels)
    assert set(final) == {0, 1, 2, 3, 4} and sum(final.values()) == 12 and set(final.values()) == {2, 3}  # 12 / 5


def run_sampler(experiences, mem_size, seed=0):
    strategy = GDumb(mem_size=mem_size)
    strategy.setup(None, experiences, seed)
    history = []
    for exp in experiences:
        strategy.add(exp)
        history.append(counts(strategy.labels))
        for (pos, idx), label in zip(strategy.memory.tolist(), strategy.labels.tolist()):
            assert experiences[pos].train.y[idx].item() == label  # the pairs point at samples of that class
        assert len({tuple(p) for p in strategy.memory.tolist()}) == len(strategy.memory)
    return strategy, history


def test_memory_is_class_balanced_across_experiences():
    experiences = [make_experience(0, [0] * 20 + [1] * 5), make_experience(1, [2] * 3 + [3] * 30),
                   make_experience(2, [0, 1, 2, 3, 4] * 10)]
    for seed in range(5):
        _, history = run_sampler(experiences, 10, seed)
        assert history[0] == {0: 5, 1: 5}  # the rare class keeps all 5: its share is 10 / 2
        assert sorted(history[1].values()) == [2, 2, 3, 3]  # 10 / 4 = 2.5 per class
        assert sum(history[2].values()) == 10 and set(history[2].values()) == {2}
    _, history = run_sampler(experiences[:1], 40)
    assert history == [{0: 20, 1: 5}]  # while there is room, everything is kept


def test_the_sampler_is_seeded_and_survives_a_resume():
    experiences = [make_experience(p, [0, 1, 2, 3] * 15, seed=p) for p in range(3)]
    a, _ = run_sampler(experiences, 16, seed=3)
    b, _ = run_sampler(experiences, 16, seed=3)
    c, _ = run_sampler(experiences, 16, seed=4)
    assert torch.equal(a.memory, b.memory) and not torch.equal(a.memory, c.memory)
    head = GDumb(mem_size=16)
    head.setup(None, experiences, 3)
    for exp in experiences[:2]:
        head.add(exp)
    resumed = GDumb(mem_size=16)
    resumed.setup(None, experiences, 3)
    resumed.load_state_dict(roundtrip(head.state_dict()))
    resumed.add(experiences[2])
    assert torch.equal(resumed.memory, a.memory) and torch.equal(resumed.labels, a.labels)


# -- the learner -----------------------------------------------------------------------------
def test_each_experience_trains_from_the_initial_weights_on_the_memory_only():
    experiences = [make_experience(0, [0, 1] * 12), make_experience(1, [2, 3] * 12)]
    strategy = GDumb(mem_size=10)
    module = make_module(strategy)
    strategy.setup(module.context, experiences, 0)
    initial = copy.deepcopy(module.model.state_dict())
    train_experience(strategy, module, experiences[0])
    trained = copy.deepcopy(module.model.state_dict())
    assert any(not torch.equal(trained[k], initial[k]) for k in initial)
    strategy.before_experience(module.context, experiences[1])
    assert all(torch.equal(module.model.state_dict()[k], initial[k]) for k in initial)
    data = strategy.train_dataset(experiences[1])
    rows = data[list(range(len(data)))][0][:, :2].long().tolist()
    assert sorted(map(tuple, rows)) == sorted(map(tuple, strategy.memory.tolist())) and len(rows) == 10
    assert sorted(counts(strategy.labels).values()) == [2, 2, 3, 3]
    assert {pos for pos, _ in rows} == {0, 1}  # old and new samples alike come from the memory
    # A resumed strategy (the model holding trained weights) resets to the same initial weights.
    state = roundtrip(strategy.state_dict())
    with torch.no_grad():
        for p in module.model.parameters():
            p.add_(1.0)
    restored = GDumb(mem_size=10)
    restored.setup(module.context, experiences, 0)
    restored.load_state_dict(state)
    restored.before_experience(module.context, make_experience(2, [0, 4] * 3))
    assert all(torch.equal(module.model.state_dict()[k], initial[k]) for k in initial)


def test_bad_settings_are_refused():
    from clbench.plugins.build import check_init_args

    with pytest.raises(UserError, match="mem_size must be >= 1"):
        check_init_args(GDumb, {"mem_size": 0}, "strategy.init_args")
    assert GDumb.requires == {"classification"}


# -- runs ------------------------------------------------------------------------------------
def test_a_digits_run_records_its_settings_and_resumes_exactly(tmp_path, monkeypatch):
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    cfg = resolve_config(tiny_config(strategy={"class_path": "gdumb", "init_args": {"mem_size": 150}},
                                     train={"epochs": 2, "batch_size": 32}))
    whole = run(cfg, tmp_path / "whole")
    r = whole["r_matrix"]
    assert len(r) == 3 and all(len(row) == 3 for row in r)
    assert r[0][0] > 0.3  # well above chance (0.1) from 150 samples
    assert whole["strategy"]["params"] == {"mem_size": 150}
    crash_at(monkeypatch, "stage:2:step:3", cfg, tmp_path / "crashed")
    resumed = run(cfg, tmp_path / "crashed", resume=True)
    assert resumed["r_matrix"] == whole["r_matrix"] and resumed["scores"] == whole["scores"]
