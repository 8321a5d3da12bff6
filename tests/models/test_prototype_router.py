"""The thesis's variant 2: prototype router, one routing decision, duplicated final blocks."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from helpers import crash_at, tiny_config

from clbench.data.datasets import ArrayDataset
from clbench.errors import UserError
from clbench.models.vision import vit_moe
from clbench.models.vision.prototype import PrototypeRouter, PrototypeViT, patch_stats

TINY = dict(patch_size=4, embed_dim=32, depth=4, num_heads=4, mlp_ratio=2.0)
SHAPE = (1, 8, 8)


def _tiny(seed=0, **kwargs):
    torch.manual_seed(seed)
    return vit_moe(10, SHAPE, **{**TINY, **kwargs}).eval()


def _images(means, stds, cls=(100.0, -100.0)):
    """Token batches (B, 1 + 2, D) whose two patches have exactly the given per-image mean and
    population std (patches mean +- std); a class token that the statistics must ignore."""
    means, stds = torch.tensor(means), torch.tensor(stds)
    cls = torch.tensor(cls).expand_as(means)
    return torch.stack([cls, means + stds, means - stds], 1)


def test_prototype_statistics_equal_hand_computed_means_and_stds():
    router = PrototypeRouter(2, 2, prefix=1, alpha=0.25)
    # two images, two patches each; the class token (first) is not a patch
    tokens = torch.tensor([[[100.0, 100.0], [1.0, 0.0], [3.0, 2.0]],
                           [[-50.0, 9.0], [5.0, 4.0], [7.0, 6.0]]])
    mu, sigma = patch_stats(tokens, 1)
    assert torch.allclose(mu, torch.tensor([[2.0, 1.0], [6.0, 5.0]]))
    assert torch.allclose(sigma, torch.ones(2, 2))
    router.initialize(0, tokens, owner=7)
    # all four patches: x = 1, 3, 5, 7 and y = 0, 2, 4, 6 -> means 4 and 3, variances 5
    assert torch.allclose(router.mean[0], torch.tensor([4.0, 3.0]))
    assert torch.allclose(router.std[0], torch.full((2,), math.sqrt(5.0)))
    assert router.ready.tolist() == [True, False] and router.owner.tolist() == [7, -1]
    # a training forward routes both images to the only initialised expert and moves it by EMA
    router.train()
    batch = torch.tensor([[[0.0, 0.0], [2.0, 2.0], [4.0, 2.0]],
                          [[0.0, 0.0], [2.0, 4.0], [4.0, 4.0]]])
    experts, probs = router(batch)
    assert experts.tolist() == [0, 0]
    assert torch.allclose(probs.sum(-1), torch.ones(2)) and probs[:, 1].eq(0).all()
    # batch patches: x = 2, 4, 2, 4 (mean 3, std 1); y = 2, 2, 4, 4 (mean 3, std 1)
    assert torch.allclose(router.mean[0], 0.25 * torch.tensor([4.0, 3.0]) + 0.75 * torch.tensor([3.0, 3.0]))
    assert torch.allclose(router.std[0], 0.25 * math.sqrt(5.0) + 0.75 * torch.ones(2))
    assert torch.equal(router.mean[1], torch.zeros(2))  # untouched: uninitialised and not hit
    # evaluation routes without moving the prototypes
    router.eval()
    before = router.mean.clone()
    router(batch)
    assert torch.equal(router.mean, before)


@pytest.mark.parametrize("metric", ["cosine", "w2"])
def test_routing_picks_the_nearest_prototype(metric):
    router = PrototypeRouter(2, 4, prefix=1, metric=metric, std_weight=0.5).eval()
    with torch.no_grad():
        router.mean.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [1.0, 0.0]]))
        router.std.copy_(torch.tensor([[1.0, 0.1], [1.0, 1.0], [1.0, 1.0], [0.1, 1.0]]))
        router.ready.fill_(True)
    # means near 1, 2, 0 and an image whose mean fits 0 and 3 equally: its std decides (3)
    tokens = _images([[0.1, 1.1], [-1.2, 0.1], [1.1, 0.0], [1.0, 0.0]],
                     [[1.0, 1.0], [1.0, 1.0], [1.0, 0.1], [0.1, 1.0]])
    experts, probs = router(tokens)
    assert experts.tolist() == [1, 2, 0, 3]
    assert torch.equal(probs.argmax(-1), experts)
    # an uninitialised expert takes no image: the second one goes to the next nearest (1)
    router.ready[2] = False
    experts, probs = router(tokens)
    assert experts[1].item() == 1 and probs[:, 2].eq(0).all()
    # before any prototype is initialised every image goes to expert 0
    router.ready.fill_(False)
    assert router(tokens)[0].tolist() == [0, 0, 0, 0]


def test_early_blocks_receive_no_gradient_and_stay_bitwise_unchanged():
    model = _tiny(label="Prototype router", moe_blocks=[2, 3])
    assert isinstance(model, PrototypeViT) and model.split == 2 and len(model.paths) == 4
    assert len(model.trunk.blocks) == 2 and len(model.paths[0].blocks) == 2
    trunk = {k: v.clone() for k, v in model.trunk.state_dict().items()}
    paths = {k: v.clone() for k, v in model.paths.state_dict().items()}
    model.train()
    with torch.no_grad():  # two initialised prototypes, so that two paths train
        model.router.mean[1].fill_(1.0)
        model.router.std[1].fill_(1.0)
        model.router.ready[1] = True
        model.router.ready[0] = True
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    x, y = torch.randn(16, *SHAPE), torch.randint(0, 10, (16,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    assert all(p.grad is None and not p.requires_grad for p in model.trunk.parameters())
    opt.step()
    assert all(torch.equal(v, trunk[k]) for k, v in model.trunk.state_dict().items())
    changed = [any(not torch.equal(v, paths[f"{e}.{k}"]) for k, v in path.state_dict().items())
               for e, path in enumerate(model.paths)]
    assert any(changed) and not changed[2] and not changed[3]  # only routed paths learn


def test_a_frozen_trunk_computes_its_routing_features_without_dropout():
    model = _tiny(label="Prototype router", drop_path_rate=0.5).train()
    x = torch.randn(4, *SHAPE)
    assert torch.equal(model.features(x), model.features(x)) and model.trunk.training
    thawed = _tiny(label="Prototype router", drop_path_rate=0.5, router_args={"freeze_trunk": False}).train()
    assert not torch.equal(thawed.features(x), thawed.features(x))
    assert all(p.requires_grad for p in thawed.trunk.parameters())


def test_one_path_equals_the_dense_vit_and_transferred_copies_do_too(tmp_path):
    dense = _tiny(label="ViT")
    one = _tiny(label="Prototype router", num_experts=1)
    x = torch.randn(8, *SHAPE)
    with torch.no_grad():
        assert (one(x) - dense(x)).abs().max().item() <= 1e-5
    # model transfer: every path is a copy of the dense final part, so at the start any routing
    # reproduces the dense model
    other = _tiny(seed=1, label="ViT")
    torch.save(other.state_dict(), tmp_path / "dense.pth")
    four = _tiny(seed=2, label="Prototype router", weights_path=str(tmp_path / "dense.pth"))
    with torch.no_grad():
        four.router.ready.fill_(True)
        four.router.mean.normal_()
        four.router.std.uniform_(0.5, 1.5)
        assert len(set(four.router(four.features(x))[0].tolist())) > 1  # several paths really used
        assert (four(x) - other(x)).abs().max().item() <= 1e-5


def test_a_new_domain_initialises_the_next_expert_from_one_image_per_class():
    model = _tiny(label="Prototype router", num_experts=2)
    x = torch.rand(6, *SHAPE)
    y = torch.tensor([1, 0, 1, 2, 0, 2])
    domain = SimpleNamespace(domain_id=3, train=ArrayDataset(x, y))
    model.train()
    model.begin_experience(domain)
    assert model.trunk.training and model.paths.training  # modes as they were
    with torch.no_grad():
        expected = PrototypeRouter(32, 1, prefix=1)
        expected.initialize(0, model.features(x[[1, 0, 3]]))  # the first image of classes 0, 1, 2
    assert torch.allclose(model.router.mean[0], expected.mean[0]) and torch.allclose(model.router.std[0],
                                                                                       expected.std[0])
    assert model.router.owner.tolist() == [3, -1]
    model.begin_experience(domain)  # a domain seen before gets no second expert
    assert model.router.ready.tolist() == [True, False]
    model.begin_experience(SimpleNamespace(domain_id=4, train=ArrayDataset(1 - x, y)))
    model.begin_experience(SimpleNamespace(domain_id=5, train=ArrayDataset(x.flip(-1), y)))
    assert model.router.owner.tolist() == [3, 4]  # no free expert is left for domain 5


def test_arguments_that_do_not_apply_are_refused():
    """One-line errors at model.init_args (the runner names the config file)."""
    with pytest.raises(UserError, match=r"^model\.init_args\.moe_blocks: .*suffix"):
        _tiny(router="prototype", moe_blocks=[1, 2])
    with pytest.raises(UserError, match=r"^model\.init_args\.top_k: .*top_k = 2 does not apply \(set top_k: 1\)"):
        _tiny(router="prototype", top_k=2)
    with pytest.raises(UserError, match=r"^model\.init_args\.level: "):
        _tiny(router="prototype", level="token")
    with pytest.raises(UserError, match=r"^model\.init_args\.expert_mlp_ratio: .*does not take expert_mlp_ratio"):
        _tiny(router="prototype", expert_mlp_ratio=0.5)
    with pytest.raises(UserError, match="metric"):
        _tiny(router="prototype", router_args={"metric": "l1"})


def test_a_runner_run_records_per_domain_utilization_in_result_json_and_resumes(tmp_path, monkeypatch):
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    args = {**TINY, "label": "Prototype router"}
    cfg = resolve_config(tiny_config(model={"class_path": "vit_moe", "init_args": args}))
    run(cfg, tmp_path / "run")
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    stages = result["expert_utilization"]
    assert len(stages) == 3
    for stage in stages:
        assert list(stage) == ["router"]
        utilization = torch.tensor(stage["router"]["utilization"], dtype=torch.float64)
        assert utilization.shape == (3, 4)
        assert torch.allclose(utilization.sum(1), torch.ones(3, dtype=torch.float64))
    # prototypes arrive one per domain: while experience k trains, only experts 0..k take images
    for k, stage in enumerate(result["train_expert_utilization"]):
        row = stage["router"]["utilization"][k]
        assert sum(row[: k + 1]) == pytest.approx(1.0) and not any(row[k + 1:])
    assert stages[0]["router"]["utilization"] == [[1.0, 0.0, 0.0, 0.0]] * 3
    # prototypes (buffers) and the frozen trunk survive a crash: the resumed run is the same run
    crash_at(monkeypatch, "stage:2:step:2", cfg, tmp_path / "crashed")
    resumed = run(cfg, tmp_path / "crashed", resume=True)
    assert resumed["r_matrix"] == result["r_matrix"]
    assert resumed["expert_utilization"] == result["expert_utilization"]
