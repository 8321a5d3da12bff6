"""ER-ACE: the asymmetric losses (gradients on masked classes), the step's loss by hand on a
fixed buffer, the online memory and the classes it has seen, and runs through the runner."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import crash_at, make_experience, tiny_config

from clbench.errors import UserError
from clbench.strategies.er_ace import ERACE, incoming_loss, replay_loss

from test_strategies import loader_factory, make_module, roundtrip, run_digits, train_experience


THREE_DOMAINS = ["rot0", "rot90", "invert"]


def objective():
    return make_module(ERACE()).objective  # classification over 4 classes, as the runner sets it up


# -- the losses ------------------------------------------------------------------------------
def test_incoming_loss_ignores_the_logits_of_classes_absent_from_the_batch():
    logits = torch.randn(6, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    y = torch.tensor([1, 3, 1, 3, 3, 1])
    loss = incoming_loss(objective(), logits, y)
    by_hand = F.cross_entropy(logits[:, [1, 3]], (y == 3).long())  # a softmax over classes 1 and 3 only
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-6)
    loss.backward()
    assert torch.equal(logits.grad[:, [0, 2]], torch.zeros(6, 2))  # exactly zero, not small
    assert (logits.grad[:, [1, 3]].abs() > 1e-4).all()
    logits.grad = None
    F.cross_entropy(logits, y).backward()  # plain ER's incoming loss does push them
    assert (logits.grad[:, [0, 2]].abs() > 1e-4).all()


def test_replay_loss_spans_every_class_seen_so_far():
    """A memory batch of class 0 alone still pushes down the logits of seen classes 1 and 2;
    class 3, never seen, is left alone."""
    logits = torch.randn(5, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
    y = torch.zeros(5, dtype=torch.long)
    seen = torch.tensor([True, True, True, False])
    loss = replay_loss(objective(), logits, y, seen)
    assert loss.item() == pytest.approx(F.cross_entropy(logits[:, :3], y).item(), rel=1e-6)
    loss.backward()
    assert (logits.grad[:, :3].abs() > 1e-4).all()
    assert torch.equal(logits.grad[:, 3], torch.zeros(5))


def test_the_step_swaps_the_objective_loss_for_ace_and_replays_the_memory():
    """On a fixed buffer of classes 0 and 1, an incoming batch of class 2 alone: the loss is the
    incoming CE over class 2, the replay CE over classes 0-2, and the auxiliary terms the engine
    added, which are kept; then the batch joins the memory."""
    experiences = [make_experience(0, [0, 1] * 4), make_experience(1, [2] * 8)]
    strategy = ERACE(mem_size=50, replay_batch_size=6)
    strategy.setup(None, experiences, 0)
    module = make_module(strategy)
    ctx, model = module.context, module.model
    strategy.before_experience(ctx, experiences[1])
    strategy.train_loader(ctx, strategy.train_dataset(experiences[1]), loader_factory(8))
    strategy.pairs = torch.tensor([[0, i] for i in range(6)])
    strategy.seen, strategy.seen_classes = 6, torch.tensor([True, True, False, False])

    index = torch.arange(8)
    x, y = strategy.prepare_batch(ctx, (*experiences[1].train[index.tolist()], index))
    logits = model(x)
    auxiliary = torch.tensor(0.25)
    total = strategy.training_loss(ctx, x, y, logits, F.cross_entropy(logits, y) + auxiliary)

    memory_x, memory_y = experiences[0].train.x[:6], experiences[0].train.y[:6]  # the whole memory is drawn
    expected = auxiliary + 0.0 + F.cross_entropy(model(memory_x)[:, :3], memory_y)  # one class in: its CE is 0
    assert total.item() == pytest.approx(expected.item(), rel=1e-6, abs=1e-7)
    assert strategy.seen_classes.tolist() == [True, True, True, False]
    assert len(strategy.pairs) == 14 and torch.equal(strategy.pairs[6:, 1], index)
    total.backward()  # class 3, never seen, gets no gradient from either term; plain ER's loss would push it
    assert torch.equal(model[2].weight.grad[3], torch.zeros(8)) and model[2].bias.grad[3] == 0
    assert (model[2].weight.grad[:3].abs().sum(1) > 1e-4).all()


# -- the memory ------------------------------------------------------------------------------
def test_the_memory_fills_online_from_the_first_experience():
    class Recording(ERACE):
        def training_loss(self, ctx, x, y, logits, loss):
            self.filled.append(len(self.pairs))
            return super().training_loss(ctx, x, y, logits, loss)

    experiences = [make_experience(0, [0, 1] * 20), make_experience(1, [2, 3] * 20)]
    strategy = Recording(mem_size=12)
    strategy.filled = []
    strategy.setup(None, experiences, 0)
    module = make_module(strategy)
    train_experience(strategy, module, experiences[0], batch_size=8)
    assert strategy.filled == [0, 8, 12, 12, 12]  # replay from the second step on
    assert strategy.seen == 40 and strategy.seen_classes.tolist() == [True, True, False, False]
    train_experience(strategy, module, experiences[1], batch_size=8)
    assert strategy.seen == 80 and strategy.seen_classes.all()
    kept = torch.bincount(strategy.pairs[:, 0], minlength=2)
    assert kept.sum() == 12 and kept[1] > 0  # a reservoir over the whole stream


def test_state_round_trips_and_the_restored_memory_continues_identically():
    experiences = [make_experience(0, [0, 1] * 12), make_experience(1, [2, 3] * 12)]
    strategy = ERACE(mem_size=10, replay_batch_size=4)
    strategy.setup(None, experiences, 5)
    module = make_module(strategy)
    train_experience(strategy, module, experiences[0], batch_size=8)
    restored = ERACE(mem_size=10, replay_batch_size=4)
    restored.setup(None, experiences, 5)
    restored.load_state_dict(roundtrip(strategy.state_dict()))
    assert restored.seen == strategy.seen and torch.equal(restored.pairs, strategy.pairs)
    assert torch.equal(restored.seen_classes, strategy.seen_classes)
    for s in (strategy, restored):
        s.before_experience(module.context, experiences[1])
        for start in range(0, 24, 8):
            s._incoming = torch.arange(start, start + 8)
            s.see(experiences[1].train.y[s._incoming], 4)
            s.remember()
    assert torch.equal(restored.pairs, strategy.pairs) and torch.equal(restored.seen_classes, strategy.seen_classes)


# -- settings and runs -----------------------------------------------------------------------
def test_bad_settings_and_objectives_without_class_logits_are_refused():
    from clbench.objectives.regression import Regression
    from clbench.plugins.build import check_init_args, check_requirements

    for args, field in [({"mem_size": -1}, "mem_size"), ({"replay_batch_size": 0}, "replay_batch_size")]:
        with pytest.raises(UserError) as err:
            check_init_args(ERACE, args, "strategy.init_args")
        assert err.value.where == f"strategy.init_args.{field}"
    with pytest.raises(UserError, match="strategy 'er_ace' requires an objective that scores class predictions"):
        check_requirements({"strategy": {"class_path": "er_ace"}}, ERACE, Regression, "objective 'regression'", "t")


def test_er_ace_runs_a_digits_stream_and_records_its_settings():
    args = {"mem_size": 100, "replay_batch_size": 32}
    result = run_digits("er_ace", args, domains=THREE_DOMAINS, hidden=64)
    naive = run_digits("naive", domains=THREE_DOMAINS, hidden=64)
    r = result["r_matrix"]
    assert result["experiences"] == THREE_DOMAINS and [len(row) for row in r] == [3, 3, 3]
    assert result["strategy"]["params"] == {**ERACE().hparams(), **args}
    assert r[0][0] > 0.2  # above chance (0.1) after one epoch of one domain
    assert result["scores"]["bwt"] > naive["scores"]["bwt"]


def test_a_crashed_run_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch):
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    strategy = {"class_path": "er_ace", "init_args": {"mem_size": 100, "replay_batch_size": 16}}
    cfg = resolve_config(tiny_config(strategy=strategy, train={"epochs": 2, "batch_size": 32}))
    reference = run(cfg, tmp_path / "reference")
    crash_at(monkeypatch, "stage:2:step:5", cfg, tmp_path / "crashed")
    saved = torch.load(tmp_path / "crashed" / "checkpoint.pt", weights_only=True)
    assert saved["state"]["stage"] == 2
    assert saved["strategy"]["pairs"].shape == (100, 2) and saved["strategy"]["seen_classes"].all()
    resumed = run(cfg, tmp_path / "crashed", resume=True)
    assert resumed["r_matrix"] == reference["r_matrix"]
    assert resumed["scores"] == reference["scores"]
