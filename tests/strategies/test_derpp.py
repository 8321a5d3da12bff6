"""DER++: the loss against its formula on a fixed buffer, the online reservoir (uniform over the
stream, the logits of the moment of insertion, indices carried by the batches), and runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import crash_at, make_experience, tiny_config
from torch.utils.data import TensorDataset

from clbench.data.datasets import make_loader
from clbench.errors import UserError
from clbench.data.streams import Experience
from clbench.strategies.derpp import DERpp
from clbench.strategies.stream_memory import IndexedSplit, draw, fetch, stream_into
from clbench.strategies.replay import reservoir_update

from test_strategies import loader_factory, make_module, roundtrip, run_digits, train_experience


THREE_DOMAINS = ["rot0", "rot90", "invert"]


def feed(strategy, experience, batch: int, generator: torch.Generator, classes: int = 4) -> None:
    """Stream ``experience`` into the memory in shuffled batches, each with arbitrary logits."""
    strategy.before_experience(None, experience)
    order = torch.randperm(len(experience.train), generator=generator)
    for start in range(0, len(order), batch):
        strategy._incoming = order[start:start + batch]
        strategy.store(torch.randn(len(strategy._incoming), classes, generator=generator))


# -- the memory ------------------------------------------------------------------------------
def test_batches_carry_their_sample_indices_and_prepare_batch_strips_them():
    exp = make_experience(0, [0, 1, 2, 3] * 5)
    per_sample = TensorDataset(exp.train.x, exp.train.y)  # not batched: items collated by the loader
    strategy = DERpp()
    module = make_module(strategy)
    for dataset in (exp.train, per_sample):
        wrapped = IndexedSplit(dataset)
        assert wrapped.batched == getattr(dataset, "batched", False) and len(wrapped) == 20
        x, y, index = next(iter(make_loader(wrapped, 6, shuffle=True, seed=1)))
        assert index.tolist() != list(range(6))  # shuffled, so the indices say something
        assert torch.equal(x, exp.train.x[index]) and torch.equal(y, exp.train.y[index])
        inputs, targets = strategy.prepare_batch(module.context, (x, y, index))
        assert inputs is x and targets is y and strategy._incoming is index


def test_fetch_reads_memory_rows_from_batched_and_per_sample_splits():
    first = make_experience(0, [0, 1, 2, 3] * 3)
    second = make_experience(1, [3, 2, 1, 0] * 3)
    per_sample = Experience(1, "e1", 1, [0, 1, 2, 3], TensorDataset(second.train.x, second.train.y), second.test)
    pairs = torch.tensor([[1, 4], [0, 2], [1, 0], [0, 11], [0, 2]])
    x, y, order = fetch([first, per_sample], pairs, make_module(DERpp()).objective)
    assert sorted(order.tolist()) == list(range(5))
    for row, (position, index) in zip(range(5), pairs[order].tolist()):
        source = (first, second)[position].train
        assert torch.equal(x[row], source.x[index]) and y[row] == source.y[index]


def test_stream_into_is_the_reservoir_and_says_what_it_wrote():
    g, twin = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    pairs, expected, seen = torch.zeros((0, 2), dtype=torch.long), torch.zeros((0, 2), dtype=torch.long), 0
    for n in (5, 9, 30, 7):
        incoming = torch.stack([torch.full((n,), seen), torch.arange(seen, seen + n)], dim=1)
        before = pairs.clone()
        pairs, slots, rows = stream_into(pairs, seen, incoming, 12, g)
        expected = reservoir_update(expected, seen, incoming, 12, twin)
        assert torch.equal(pairs, expected)
        assert torch.equal(pairs[slots], incoming[rows])
        untouched = torch.ones(len(before), dtype=torch.bool)
        untouched[slots[slots < len(before)]] = False
        assert torch.equal(pairs[:len(before)][untouched], before[untouched])
        seen += n
    assert len(pairs) == 12


def test_the_memory_is_a_uniform_sample_of_the_stream_fed_batch_by_batch():
    """Two experiences (30 then 50 samples) streamed in batches of 8 into 16 slots: every
    sample is kept with probability 16/80, early and late ones alike, and only once."""
    experiences = [make_experience(0, [0] * 30), make_experience(1, [1] * 50)]
    hits = {0: torch.zeros(30), 1: torch.zeros(50)}
    trials = 400
    for seed in range(trials):
        strategy = DERpp(mem_size=16)
        strategy.setup(None, experiences, seed)
        order = torch.Generator().manual_seed(10_000 + seed)
        for exp in experiences:
            feed(strategy, exp, 8, order)
        assert strategy.seen == 80 and len(strategy.pairs) == 16 and strategy.logits.shape == (16, 4)
        assert len({tuple(p) for p in strategy.pairs.tolist()}) == 16
        for position, index in strategy.pairs.tolist():
            hits[position][index] += 1
    freq = torch.cat([hits[0], hits[1]]) / trials
    sigma = (0.2 * 0.8 / trials) ** 0.5
    assert (freq - 0.2).abs().max() < 5 * sigma
    assert abs(freq[:30].mean() - 0.2) < 3 * sigma and abs(freq[30:].mean() - 0.2) < 3 * sigma


def test_the_memory_keeps_the_logits_of_the_moment_of_insertion():
    """Trained through Lightning: each slot holds the outputs its sample had in the step it was
    stored (before that step's update), not the network's outputs now; replay starts at the
    second step of the first experience."""

    class Recording(DERpp):
        def training_loss(self, ctx, x, y, logits, loss):
            self.steps.append((self._incoming.clone(), logits.detach().clone(), len(self.pairs)))
            return super().training_loss(ctx, x, y, logits, loss)

    exp = make_experience(0, [0, 1, 2, 3] * 10)
    strategy = Recording(mem_size=12, replay_batch_size=4)
    strategy.steps = []
    strategy.setup(None, [exp], 0)
    module = make_module(strategy, lr=0.5)
    train_experience(strategy, module, exp, batch_size=8)
    assert [filled for _, _, filled in strategy.steps] == [0, 8, 12, 12, 12]
    at_insertion = {int(i): row for indices, logits, _ in strategy.steps for i, row in zip(indices, logits)}
    assert strategy.pairs[:, 0].eq(0).all()
    for slot, index in enumerate(strategy.pairs[:, 1].tolist()):
        assert torch.equal(strategy.logits[slot], at_insertion[index])
    with torch.no_grad():
        now = module.model(exp.train.x[strategy.pairs[:, 1]])
    assert (now - strategy.logits).abs().max() > 0.1  # the network moved on; the memory did not


# -- the loss --------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha,beta", [(0.3, 0.7), (0.5, 0.0)])
def test_loss_is_ce_plus_alpha_mse_plus_beta_ce_on_a_fixed_buffer(alpha, beta):
    experiences = [make_experience(0, [0, 1, 2, 3] * 3), make_experience(1, [3, 2, 1, 0] * 3)]
    strategy = DERpp(mem_size=50, alpha=alpha, beta=beta, replay_batch_size=4)
    strategy.setup(None, experiences, 0)
    module = make_module(strategy)
    ctx, model = module.context, module.model
    strategy.before_experience(ctx, experiences[1])
    strategy.train_loader(ctx, strategy.train_dataset(experiences[1]), loader_factory(8))
    pairs = torch.tensor([[0, 1], [0, 4], [0, 5], [0, 7], [0, 9], [0, 11]])
    stored = torch.randn(6, 4, generator=torch.Generator().manual_seed(2))
    strategy.pairs, strategy.logits, strategy.seen = pairs.clone(), stored.clone(), 6
    strategy._draws, twin = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)

    index = torch.arange(8)
    x, y = strategy.prepare_batch(ctx, (*experiences[1].train[index.tolist()], index))
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    total = strategy.training_loss(ctx, x, y, logits, loss)

    first = draw(6, 4, twin)
    memory_x, memory_y = experiences[0].train.x, experiences[0].train.y
    expected = loss + alpha * (model(memory_x[pairs[first, 1]]) - stored[first]).pow(2).mean()
    if beta:
        second = draw(6, 4, twin)
        assert not torch.equal(first.sort().values, second.sort().values)  # two independent batches
        expected = expected + beta * F.cross_entropy(model(memory_x[pairs[second, 1]]), memory_y[pairs[second, 1]])
    assert total.item() == pytest.approx(expected.item(), rel=1e-6)
    # The current batch went into the memory after the draws, with this step's logits.
    assert len(strategy.pairs) == 14 and torch.equal(strategy.pairs[6:], torch.stack([torch.ones(8).long(), index], 1))
    assert torch.equal(strategy.logits[:6], stored) and torch.equal(strategy.logits[6:], logits.detach())


def test_an_empty_memory_adds_nothing_and_zero_weights_train_as_naive():
    exp = make_experience(0, [0, 1, 2, 3] * 2)
    strategy = DERpp()
    strategy.setup(None, [exp], 0)
    module = make_module(strategy)
    strategy.before_experience(module.context, exp)
    x, y = strategy.prepare_batch(module.context, (exp.train.x, exp.train.y, torch.arange(8)))
    logits = module.model(x)
    loss = F.cross_entropy(logits, y)
    assert strategy.training_loss(module.context, x, y, logits, loss) is loss
    assert len(strategy.pairs) == 8
    naive = run_digits("naive", domains=THREE_DOMAINS, hidden=64)
    silent = run_digits("derpp", {"alpha": 0.0, "beta": 0.0}, domains=THREE_DOMAINS, hidden=64)
    assert silent["r_matrix"] == naive["r_matrix"]  # indexing the batches changes nothing else


def test_a_head_that_changes_width_is_refused():
    exp = make_experience(0, [0, 1, 2, 3])
    strategy = DERpp()
    strategy.setup(None, [exp], 0)
    strategy.before_experience(None, exp)
    strategy._incoming = torch.arange(2)
    strategy.store(torch.zeros(2, 4))
    strategy._incoming = torch.arange(2, 4)
    with pytest.raises(UserError, match="stored logits over 4 outputs and the model now gives 6"):
        strategy.store(torch.zeros(2, 6))


# -- state, settings, runs -------------------------------------------------------------------
def test_state_round_trips_and_the_restored_reservoir_continues_identically():
    experiences = [make_experience(0, [0, 1] * 15), make_experience(1, [2, 3] * 15)]
    strategy = DERpp(mem_size=10)
    strategy.setup(None, experiences, 4)
    feed(strategy, experiences[0], 8, torch.Generator().manual_seed(0))
    restored = DERpp(mem_size=10)
    restored.setup(None, experiences, 4)
    restored.load_state_dict(roundtrip(strategy.state_dict()))
    assert restored.seen == 30 and torch.equal(restored.pairs, strategy.pairs)
    assert torch.equal(restored.logits, strategy.logits)
    for s in (strategy, restored):
        feed(s, experiences[1], 8, torch.Generator().manual_seed(1))
    assert torch.equal(restored.pairs, strategy.pairs) and torch.equal(restored.logits, strategy.logits)
    assert set(strategy.pairs[:, 0].tolist()) == {0, 1}


def test_bad_settings_and_objectives_without_class_logits_are_refused():
    from clbench.objectives.regression import Regression
    from clbench.plugins.build import check_init_args, check_requirements

    for args, field in [({"mem_size": -1}, "mem_size"), ({"alpha": -0.1}, "alpha"), ({"beta": -1.0}, "beta"),
                        ({"replay_batch_size": 0}, "replay_batch_size")]:
        with pytest.raises(UserError) as err:
            check_init_args(DERpp, args, "strategy.init_args")
        assert err.value.where == f"strategy.init_args.{field}"
    with pytest.raises(UserError, match="strategy 'derpp' requires an objective that scores class predictions"):
        check_requirements({"strategy": {"class_path": "derpp"}}, DERpp, Regression, "objective 'regression'", "t")


def test_derpp_runs_a_digits_stream_records_its_settings_and_forgets_less_than_naive():
    args = {"mem_size": 100, "alpha": 0.5}
    result = run_digits("derpp", args, domains=THREE_DOMAINS, hidden=64)
    naive = run_digits("naive", domains=THREE_DOMAINS, hidden=64)
    r = result["r_matrix"]
    assert result["experiences"] == THREE_DOMAINS and [len(row) for row in r] == [3, 3, 3]
    assert result["strategy"]["params"] == {**DERpp().hparams(), **args}
    assert r[0][0] > 0.2  # above chance (0.1) after one epoch of one domain
    assert result["scores"]["bwt"] > naive["scores"]["bwt"]


def test_a_crashed_run_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch):
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run
    from clbench.plugins.build import build_benchmark

    strategy = {"class_path": "derpp", "init_args": {"mem_size": 100, "replay_batch_size": 16}}
    cfg = resolve_config(tiny_config(strategy=strategy, train={"epochs": 2, "batch_size": 32}))
    reference = run(cfg, tmp_path / "reference")
    crash_at(monkeypatch, "stage:2:step:5", cfg, tmp_path / "crashed")
    saved = torch.load(tmp_path / "crashed" / "checkpoint.pt", weights_only=True)
    assert saved["state"]["stage"] == 2
    state = saved["strategy"]
    assert state["pairs"].shape == (100, 2) and state["logits"].shape == (100, 10)
    sizes = [len(exp.dataset) for exp in build_benchmark(cfg, "test").train_stream]
    assert state["seen"] == 2 * (sizes[0] + sizes[1])  # both epochs of both experiences streamed through
    assert set(state["pairs"][:, 0].tolist()) == {0, 1}
    resumed = run(cfg, tmp_path / "crashed", resume=True)
    assert resumed["r_matrix"] == reference["r_matrix"]
    assert resumed["scores"] == reference["scores"]
