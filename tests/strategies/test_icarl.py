"""iCaRL: herding, the exemplar memory, the loss of Alg. 3, NME classification as evaluated, runs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from helpers import crash_at, make_experience, tiny_model

from clbench.errors import UserError
from clbench.strategies.icarl import ICaRL, herding, icarl_loss

from test_strategies import fit, loader_factory, make_module, roundtrip, train_experience


def unit(*degrees: float) -> torch.Tensor:
    return torch.tensor([[math.cos(math.radians(a)), math.sin(math.radians(a))] for a in degrees])


# -- herding (Alg. 4) -------------------------------------------------------------------------
def test_herding_picks_by_hand():
    """Unit vectors at 100°, 30°, -100°, 0°, -50°: their mean points at -7.0°. Worked by hand:
    0° is nearest (7° off); 0°+x then points at 15°, -25°, 50°, -50°, so -50° (18° off); then
    30° brings the sum to -6.05°; then -100° (-28.2°, against 17.1° for 100°); 100° last."""
    features = unit(100, 30, -100, 0, -50)
    assert herding(features, 5).tolist() == [3, 4, 1, 2, 0]
    assert herding(features, 2).tolist() == [3, 4]
    assert herding(features, 9).tolist() == [3, 4, 1, 2, 0]  # never more than the class has, never twice


def test_herding_is_greedy_on_the_running_mean():
    """Each pick is, among the samples not yet picked, the one whose addition brings the
    (re-normalised) running mean closest to the class mean."""
    g = torch.Generator().manual_seed(0)
    features = F.normalize(torch.randn(40, 6, generator=g) + torch.tensor([2.0, 0, 0, 0, 0, 0]), dim=1)
    order = herding(features, 12).tolist()
    mu = features.mean(0) / features.mean(0).norm()
    total = torch.zeros(6)
    for k, pick in enumerate(order):
        distances = {i: ((total + features[i]) / (total + features[i]).norm() - mu).norm().item()
                     for i in range(40) if i not in order[:k]}
        assert distances[pick] == pytest.approx(min(distances.values()), abs=1e-6)
        total += features[pick]
    # The herded mean of 12 is closer to the class mean than a random 12 on average.
    herded = (F.normalize(features[order].mean(0), dim=0) - mu).norm()
    random = [(F.normalize(features[torch.randperm(40, generator=g)[:12]].mean(0), dim=0) - mu).norm()
              for _ in range(50)]
    assert herded < torch.stack(random).mean() / 3
    assert herding(features, 5).tolist() == order[:5]  # a shorter list is a prefix: what Alg. 5 keeps


# -- the loss (Alg. 3) ------------------------------------------------------------------------
def test_loss_is_the_binary_cross_entropy_of_algorithm_3():
    g = torch.Generator().manual_seed(1)
    logits, teacher = torch.randn(5, 6, generator=g), torch.randn(5, 6, generator=g)
    y = torch.tensor([2, 3, 0, 3, 1])
    seen, old = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1])  # new: 2, 3; 4 and 5 not seen yet
    s, q = torch.sigmoid(logits), torch.sigmoid(teacher)
    expected = 0.0
    for i in range(5):
        for c in (2, 3):
            d = float(y[i] == c)
            expected -= d * s[i, c].log() + (1 - d) * (1 - s[i, c]).log()
        for c in (0, 1):
            expected -= q[i, c] * s[i, c].log() + (1 - q[i, c]) * (1 - s[i, c]).log()
    assert icarl_loss(logits, y, seen, old, teacher).item() == pytest.approx(expected.item() / 5, rel=1e-5)
    moved = logits.clone()
    moved[:, 4:] += 5.0  # unseen classes' outputs are not in the loss
    assert icarl_loss(moved, y, seen, old, teacher).item() == pytest.approx(expected.item() / 5, rel=1e-5)
    # no old classes: one-hot targets on the seen ones
    first = -(F.one_hot(y, 6)[:, :4] * s[:, :4].log() + (1 - F.one_hot(y, 6)[:, :4]) * (1 - s[:, :4]).log())
    assert icarl_loss(logits, y, seen, torch.zeros(0, dtype=torch.long), None).item() == pytest.approx(
        first.sum(1).mean().item(), rel=1e-5)


def test_training_loss_replaces_the_task_loss_and_distils_the_model_of_the_experience_start():
    experiences = [make_experience(0, [0, 1] * 8), make_experience(1, [2, 3] * 8)]
    strategy = ICaRL(mem_size=8)
    module = make_module(strategy)
    strategy.setup(module.context, experiences, 0)
    train_experience(strategy, module, experiences[0])
    strategy.before_experience(module.context, experiences[1])
    with torch.no_grad():
        teacher = module.model(experiences[1].train.x).clone()
        module.model[2].weight.add_(0.3)  # the student moves on; the teacher stays
    x, y = experiences[1].train.x, experiences[1].train.y
    logits = module.model(x)
    aux = torch.tensor(0.7)
    total = strategy.training_loss(module.context, x, y, logits, F.cross_entropy(logits, y) + aux)
    expected = icarl_loss(logits, y, torch.arange(4), torch.tensor([0, 1]), teacher) + aux
    assert total.item() == pytest.approx(expected.item(), rel=1e-5)


# -- the memory (Alg. 2, 5) and NME classification (Alg. 1) --------------------------------------
def features_of(model, x):
    with torch.no_grad():
        return F.normalize(model[:-1](x), dim=1)


def trained_icarl(mem_size=10):
    experiences = [make_experience(0, [0, 1] * 12), make_experience(1, [2, 3] * 12)]
    strategy = ICaRL(mem_size=mem_size)
    module = make_module(strategy)
    strategy.setup(module.context, experiences, 0)
    return strategy, module, experiences


def test_memory_keeps_herding_prefixes_and_m_equals_k_over_t():
    strategy, module, experiences = trained_icarl(mem_size=10)
    train_experience(strategy, module, experiences[0])
    first = {c: p.clone() for c, p in strategy.exemplars.items()}
    assert {c: len(p) for c, p in first.items()} == {0: 5, 1: 5}  # K / t = 10 / 2
    for c, pairs in first.items():  # herded with the trained network on the class's samples
        rows = torch.nonzero(experiences[0].train.y == c).flatten()
        expected = rows[herding(features_of(module.model, experiences[0].train.x[rows]), 5)]
        assert pairs[:, 0].tolist() == [0] * 5 and pairs[:, 1].tolist() == expected.tolist()
    train_experience(strategy, module, experiences[1])
    assert {c: len(p) for c, p in strategy.exemplars.items()} == {0: 2, 1: 2, 2: 2, 3: 2}  # 10 // 4
    for c in (0, 1):  # Alg. 5: the first m of each list
        assert torch.equal(strategy.exemplars[c], first[c][:2])
    assert strategy.seen_classes == [0, 1, 2, 3]


def test_the_second_experience_trains_on_its_data_and_the_exemplars():
    strategy, module, experiences = trained_icarl(mem_size=10)
    train_experience(strategy, module, experiences[0])
    strategy.before_experience(module.context, experiences[1])
    data = strategy.train_dataset(experiences[1])
    pairs = {tuple(p) for p in data[list(range(len(data)))][0][:, :2].long().tolist()}
    stored = {tuple(p) for c in (0, 1) for p in strategy.exemplars[c].tolist()}
    assert pairs == {(1, i) for i in range(24)} | stored and len(data) == 24 + 10


def test_nme_predictions_are_the_nearest_exemplar_mean_and_what_accuracy_scores():
    strategy, module, experiences = trained_icarl(mem_size=10)
    train_experience(strategy, module, experiences[0])
    strategy.adapt_model(module.context, 2)
    strategy.before_experience(module.context, experiences[1])
    train_loader = strategy.train_loader(module.context, strategy.train_dataset(experiences[1]), loader_factory())
    fit(module, train_loader)
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(40, 4, generator=g), torch.randint(0, 4, (40,), generator=g)
    plain = module.model(x).detach()
    with strategy.evaluating(module.context, None):  # the exemplars of the network just trained
        scores = module.model(x).detach()
    classifier = strategy._classifier
    feats = features_of(module.model, x)
    means = []
    for c in range(4):
        pairs = classifier.exemplars[c]
        inputs = torch.stack([experiences[p].train.x[i] for p, i in pairs.tolist()])
        means.append(F.normalize(features_of(module.model, inputs).mean(0), dim=0))
    distance = torch.stack([(feats - mu).norm(dim=1) for mu in means], dim=1)
    assert torch.equal(scores.argmax(1), distance.argmin(1))
    assert torch.allclose(scores, -distance, atol=1e-5)
    assert not torch.equal(scores.argmax(1), plain.argmax(1))  # not the network's own head
    assert torch.equal(module.model(x), plain)  # the hooks are gone after the batch
    # What the run records: the column's accuracy is the NME classifier's.
    module.validation_step((x, y), 0)
    acc = module.eval_metrics[0].compute()["acc"].item()
    assert acc == pytest.approx((distance.argmin(1) == y).float().mean().item())
    # The selection made for evaluation is what the memory keeps.
    strategy.after_experience(module.context, experiences[1])
    assert all(torch.equal(strategy.exemplars[c], classifier.exemplars[c]) for c in range(4))


def test_untrained_network_is_scored_on_its_own_outputs_and_a_step_rebuilds_the_means():
    strategy, module, experiences = trained_icarl()
    x = experiences[0].train.x
    with strategy.evaluating(module.context, None):  # r_init: no class has exemplars
        assert torch.equal(module.model(x), tiny_model()(x))
    train_experience(strategy, module, experiences[0])
    with strategy.evaluating(module.context, None):
        before = module.model(x)
    with torch.no_grad():
        module.model[0].weight.mul_(-1.0)
    strategy.after_optimizer_step(module.context)  # the weights changed: the means are recomputed
    with strategy.evaluating(module.context, None):
        after = module.model(x)
    assert not torch.allclose(before, after)


def test_refusals():
    strategy = ICaRL(mem_size=3)
    module = make_module(strategy)
    with pytest.raises(UserError, match="mem_size"):
        strategy.setup(module.context, [make_experience(0, [0, 1]), make_experience(1, [2, 3])], 0)
    headless = ICaRL()
    module = make_module(headless, model=nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)))
    with pytest.raises(UserError, match="no nn.Linear with 4 outputs"):
        headless.setup(module.context, [], 0)
    assert ICaRL.supports == {"class-il"} and ICaRL.requires == {"classification"}
    from clbench.plugins.build import check_init_args

    with pytest.raises(UserError, match="mem_size must be >= 1"):
        check_init_args(ICaRL, {"mem_size": 0}, "strategy.init_args")


def test_state_round_trips():
    strategy, module, experiences = trained_icarl()
    train_experience(strategy, module, experiences[0])
    restored = ICaRL(mem_size=10)
    restored.setup(module.context, experiences, 0)
    restored.load_state_dict(roundtrip(strategy.state_dict()))
    assert restored.seen_classes == [0, 1]
    assert all(torch.equal(restored.exemplars[c], strategy.exemplars[c]) for c in (0, 1))


# -- runs ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fashion_root(tmp_path_factory):
    from dataset_layouts import write_fashion_mnist

    return write_fashion_mnist(tmp_path_factory.mktemp("fm"), train_per_class=30, test_per_class=10)


def split_config(root, strategy: dict) -> dict:
    from clbench.config.load import resolve_config

    benchmark = {"class_path": "fashion-mnist-split",
                 "init_args": {"root": str(root), "verify": "header", "tasks": [[0, 1], [2, 3], [4, 5]]}}
    model = {"class_path": "mlp", "init_args": {"hidden": 32}}
    train = {"epochs": 2, "batch_size": 32, "optimizer": {"class_path": "adam", "init_args": {"lr": 0.01}}}
    return resolve_config({"seed": 0, "benchmark": benchmark, "model": model, "strategy": strategy, "train": train,
                           "logging": {"tensorboard": False, "progress": False}})


def test_a_class_incremental_run_resumes_exactly(fashion_root, tmp_path, monkeypatch):
    from clbench.engine.runner import run

    cfg = split_config(fashion_root, {"class_path": "icarl", "init_args": {"mem_size": 30}})
    whole = run(cfg, tmp_path / "whole")
    r = whole["r_matrix"]
    assert len(r) == 3 and all(len(row) == 3 for row in r)
    assert r[0][0] > 0.6 and r[2][0] > 0.6  # above the 0.5 of guessing the first pair; old classes kept
    assert whole["strategy"]["params"] == {"mem_size": 30}
    crash_at(monkeypatch, "stage:2:step:1", cfg, tmp_path / "crashed")
    resumed = run(cfg, tmp_path / "crashed", resume=True)
    assert resumed["r_matrix"] == whole["r_matrix"] and resumed["scores"] == whole["scores"]


def test_a_domain_incremental_stream_is_refused():
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    cfg = resolve_config({"benchmark": {"class_path": "digits-domains", "init_args": {"domains": ["rot0"]}},
                          "strategy": "icarl", "logging": {"tensorboard": False, "progress": False}})
    with pytest.raises(UserError, match="does not support domain-il"):
        run(cfg, None, source="test")
