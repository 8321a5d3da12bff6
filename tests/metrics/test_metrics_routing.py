"""Expert utilization fed through the routing-record mechanism by a small MoE layer."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from clbench.metrics import ExpertUtilization, RoutingRecorder
from clbench.models import routing_channel as routing
from clbench.metrics.functional import (coefficient_of_variation, mutual_information,
                                        normalized_entropy)


class TinyMoE(nn.Module):
    """Top-k token-routed mixture of linear experts that reports its routing."""

    records_routing = True

    def __init__(self, dim: int, num_experts: int, k: int):
        super().__init__()
        self.num_experts, self.k = num_experts, k
        self.router = nn.Linear(dim, num_experts)
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gates = self.router(x).softmax(-1)                       # (B, T, E)
        top = gates.topk(self.k, dim=-1)                         # (B, T, k)
        routing.record(self, experts=top.indices, gates=gates)
        weights = top.values / top.values.sum(-1, keepdim=True)
        outputs = torch.stack([expert(x) for expert in self.experts], dim=-2)   # (B, T, E, D)
        chosen = torch.gather(outputs, -2, top.indices[..., None].expand(*top.indices.shape,
                                                                         x.shape[-1]))
        return x + (weights[..., None] * chosen).sum(-2)


class TwoLayerNet(nn.Module):
    def __init__(self, dim=8, experts=(4, 3), k=(2, 1)):
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.moe1 = TinyMoE(dim, experts[0], k[0])
        self.moe2 = TinyMoE(dim, experts[1], k[1])

    def forward(self, x):
        return self.moe2(self.moe1(self.inp(x)))


def _capture(model):
    """The routing each MoE layer actually used, captured independently with forward hooks."""
    seen = {}

    def hook(name):
        def fn(module, inputs, output):
            gates = module.router(inputs[0]).softmax(-1)
            seen.setdefault(name, []).append((gates.topk(module.k, -1).indices, gates))
        return fn

    handles = [getattr(model, name).register_forward_hook(hook(name)) for name in ("moe1", "moe2")]
    return seen, handles


def test_recorder_matches_direct_counts_per_domain_and_layer():
    torch.manual_seed(0)
    model = TwoLayerNet()
    recorder = RoutingRecorder(num_domains=3).attach(model)
    assert sorted(recorder.metrics) == ["moe1", "moe2"]
    seen, handles = _capture(model)
    batches = {0: [torch.randn(5, 7, 8), torch.randn(3, 7, 8)],
               1: [torch.randn(4, 7, 8) + 2.0], 2: [torch.randn(6, 7, 8) - 1.0]}
    with torch.no_grad():
        for d, xs in batches.items():
            with recorder.domain(d):
                for x in xs:
                    model(x)
    for h in handles:
        h.remove()
    figures = recorder.compute()
    for name, k, num_experts in (("moe1", 2, 4), ("moe2", 1, 3)):
        util = np.zeros((3, num_experts))
        soft = np.zeros((3, num_experts))
        units = np.zeros(3)
        records = iter(seen[name])
        for d, xs in batches.items():
            for _ in xs:
                idx, gates = next(records)
                idx, gates = idx.reshape(-1, k).numpy(), gates.reshape(-1, num_experts).numpy()
                for row in idx:
                    for e in row:
                        util[d, e] += 1.0 / k
                soft[d] += gates.sum(0)
                units[d] += idx.shape[0]
        got = figures[name]
        np.testing.assert_allclose(got["utilization"].numpy(), util / units[:, None], atol=1e-12)
        np.testing.assert_allclose(got["soft_utilization"].numpy(), soft / units[:, None],
                                   atol=1e-6)
        np.testing.assert_allclose(got["utilization"].sum(1).numpy(), np.ones(3), atol=1e-12)
        np.testing.assert_array_equal(got["units"].numpy(), units)
        u = util / units[:, None]
        entropy = -np.sum(np.where(u > 0, u * np.log(np.where(u > 0, u, 1)), 0), 1)
        np.testing.assert_allclose(got["domain_entropy"].numpy(), entropy / np.log(num_experts),
                                   atol=1e-12)
        load = util.sum(0)
        assert float(got["load_imbalance"]) == pytest.approx(load.std() / load.mean(), abs=1e-12)
        p = util / util.sum()
        mi = np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1) /
                                               (p.sum(1, keepdims=True) * p.sum(0, keepdims=True))), 0))
        assert float(got["mutual_information"]) == pytest.approx(mi, abs=1e-12)
    recorder.reset()
    assert float(recorder.metrics["moe1"].units.sum()) == 0.0


def test_record_is_a_no_op_outside_a_domain_block():
    model = TwoLayerNet()
    recorder = RoutingRecorder(num_domains=2).attach(model)
    assert not routing.is_recording()
    model(torch.randn(2, 3, 8))
    with recorder.domain(1):
        assert routing.is_recording()
        model(torch.randn(2, 3, 8))
    model(torch.randn(2, 3, 8))
    units = recorder.metrics["moe1"].units
    assert units.tolist() == [0.0, 6.0]


def test_nested_domain_blocks_restore_the_outer_domain():
    recorder = RoutingRecorder(num_domains=3)
    one = torch.tensor([[0]])
    with recorder.domain(0):
        routing.record("layer", experts=one, num_experts=2)
        with recorder.domain(2):
            routing.record("layer", experts=one)
        routing.record("layer", experts=one)
    assert recorder.metrics["layer"].units.tolist() == [2.0, 0.0, 1.0]


def test_hand_worked_utilization_collapse_and_specialization():
    metric = ExpertUtilization(num_domains=2, num_experts=2)
    # domain 0 always uses expert 0, domain 1 always expert 1: full specialization
    metric.update(experts=torch.tensor([[0], [0], [0]]), domain=0)
    metric.update(experts=torch.tensor([[1], [1], [1]]), domain=1)
    out = metric.compute()
    assert out["utilization"].tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert out["domain_entropy"].tolist() == [0.0, 0.0]
    assert float(out["load_imbalance"]) == pytest.approx(0.0)
    assert float(out["mutual_information"]) == pytest.approx(math.log(2))
    # collapse: every domain on expert 0. Same per-domain entropy, but no information and
    # the largest imbalance, sqrt(E - 1)
    collapsed = ExpertUtilization(num_domains=2, num_experts=2)
    collapsed.update(experts=torch.tensor([[0], [0]]), domain=torch.tensor([0, 1]))
    out = collapsed.compute()
    assert float(out["mutual_information"]) == pytest.approx(0.0)
    assert float(out["load_imbalance"]) == pytest.approx(1.0)
    assert out["domain_load_imbalance"].tolist() == pytest.approx([1.0, 1.0])


def test_top2_mask_and_gates_only():
    metric = ExpertUtilization(num_domains=1, num_experts=4)
    experts = torch.tensor([[0, 1], [2, 3], [0, 2]])
    mask = torch.tensor([True, True, False])
    metric.update(experts=experts, domain=0, mask=mask)
    assert metric.compute()["utilization"].tolist() == [[0.25, 0.25, 0.25, 0.25]]
    gates_only = ExpertUtilization(num_domains=1, num_experts=3)
    gates = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    gates_only.update(gates=gates)
    out = gates_only.compute()
    assert out["utilization"].tolist() == [[0.5, 0.0, 0.5]]
    assert out["soft_utilization"].numpy() == pytest.approx(np.array([[0.4, 0.15, 0.45]]))
    h = [-(p * np.log(p)).sum() / np.log(3) for p in gates.numpy()]
    # torchmetrics squeezes one-element results: with one domain the (D,) vectors are 0-dim
    assert out["gate_entropy"].ndim == 0
    assert float(out["gate_entropy"]) == pytest.approx(np.mean(h))
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert torch.isnan(ExpertUtilization(2, 2).compute()["utilization"]).all()


def test_keep_routes_and_unattached_layers():
    model = TwoLayerNet()
    recorder = RoutingRecorder(num_domains=2, keep_routes=True).attach(model, prefix="net")
    assert sorted(recorder.metrics) == ["net.moe1", "net.moe2"]
    with torch.no_grad(), recorder.domain(1):
        model(torch.randn(2, 5, 8))
    domains, experts = recorder.routes("net.moe1")
    assert domains.tolist() == [1] * 10 and experts.shape == (10, 2)
    stray = TinyMoE(8, 2, 1)
    with recorder.domain(0), pytest.raises(ValueError, match="not attached"):
        stray(torch.randn(1, 2, 8))
    with pytest.raises(ValueError, match="records_routing"):
        RoutingRecorder(2).attach(nn.Linear(2, 2))


def test_functional_helpers_on_known_values():
    assert normalized_entropy(torch.tensor([0.25, 0.25, 0.25, 0.25])).item() == pytest.approx(1.0)
    assert normalized_entropy(torch.tensor([1.0, 0.0, 0.0])).item() == 0.0
    assert coefficient_of_variation(torch.tensor([1.0, 0.0, 0.0, 0.0])).item() == pytest.approx(
        math.sqrt(3))
    table = torch.tensor([[2.0, 2.0], [2.0, 2.0]])
    assert mutual_information(table).item() == pytest.approx(0.0)


def test_bad_routing_input_is_rejected():
    metric = ExpertUtilization(2, 3)
    with pytest.raises(ValueError, match="expert indices"):
        metric.update(experts=torch.tensor([[3]]))
    with pytest.raises(ValueError, match="domain"):
        metric.update(experts=torch.tensor([[0]]), domain=2)
    with pytest.raises(ValueError, match="gates"):
        metric.update(gates=torch.ones(2, 4) / 4)


def test_units_drop_padding_and_label_compositions():
    """A token mask removes padded tokens from utilization and N_eff; labels form compositions."""
    from clbench.metrics import effective_compositions

    torch.manual_seed(0)
    model = TwoLayerNet()
    recorder = RoutingRecorder(num_domains=2, keep_routes=True, compositions=True).attach(model)
    x = torch.randn(3, 4, 8)
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    labels = torch.arange(12).reshape(3, 4) % 2  # e.g. a position bucket per token
    with torch.no_grad(), recorder.domain(1), routing.units(token_mask=mask, token_labels=labels):
        model(x)
    figures = recorder.compute()
    assert figures["moe2"]["units"][1].item() == mask.sum().item() == 9
    domains, experts = recorder.routes("moe2")
    assert experts.shape == (9, 1)
    # N_eff by hand from the kept routes and the unmasked tokens' labels
    expected = effective_compositions(experts, labels.reshape(-1)[mask.reshape(-1)]).n_eff
    summary = recorder.compositions([1])
    assert summary["moe2"]["n_eff"] == pytest.approx(expected)
    assert summary["moe2"]["units"] == 9 and summary["moe2"]["compositions"] == 2
    assert recorder.compositions([0]) == {}  # no unit of domain 0
    # a top-2 layer's route is the unordered set of its two experts
    _, routes1 = recorder.routes("moe1")
    assert summary["moe1"]["n_eff"] == pytest.approx(
        effective_compositions(routes1, labels.reshape(-1)[mask.reshape(-1)], unordered_routes=True).n_eff)
    recorder.reset()
    assert recorder.compositions() == {}


def test_sample_labels_repeat_over_a_samples_units_and_paused_records_nothing():
    model = TwoLayerNet()
    recorder = RoutingRecorder(num_domains=1, compositions=True).attach(model)
    classes = torch.tensor([0, 0, 1])
    with torch.no_grad(), recorder.domain(0):
        with routing.units(sample_labels=classes):  # 5 tokens per sample: each inherits its class
            model(torch.randn(3, 5, 8))
        with routing.paused():
            model(torch.randn(3, 5, 8))
    assert recorder.compute()["moe2"]["units"].item() == 15  # the paused forward added nothing
    assert recorder.compositions()["moe2"]["compositions"] == 2  # (domain 0, class 0) and (0, 1)
    with pytest.raises(ValueError, match="compositions=True"):
        RoutingRecorder(1).attach(model).compositions()


def test_a_layout_that_does_not_match_the_units_is_not_applied():
    from clbench.models.routing_channel import UnitLayout

    layout = UnitLayout(token_mask=torch.ones(2, 3, dtype=torch.bool))
    assert layout.resolve(6)[0].tolist() == [True] * 6
    assert layout.resolve(5) == (None, None)  # not a whole number of units per sample
    mask, labels = layout.resolve(8)  # a one-position prefix before each sample's 3 tokens
    assert mask.tolist() == [False, True, True, True] * 2 and labels is None
    with_samples = UnitLayout(token_mask=torch.ones(2, 3, dtype=torch.bool), sample_labels=torch.tensor([[4], [7]]))
    assert with_samples.resolve(8)[1].reshape(-1).tolist() == [4] * 4 + [7] * 4
    per_image = UnitLayout(sample_labels=torch.tensor([[4], [7]]))  # e.g. 5 patches routed per image
    mask, labels = per_image.resolve(10)
    assert mask is None and labels.reshape(-1).tolist() == [4] * 5 + [7] * 5


def test_units_the_layout_cannot_label_are_left_out_of_n_eff_and_reported():
    """A composition is (domain, *labels) with the same labels for every unit of a layer: a record
    whose unit count does not match the batch's layout (here 3 of a 2-sample batch's 4 tokens)
    cannot be labelled, so it is counted as unlabelled instead of as a shorter composition."""
    from clbench.metrics import effective_compositions
    from clbench.metrics.compositions import CompositionCounter

    recorder = RoutingRecorder(num_domains=2, compositions=True)
    labels = torch.tensor([[0, 1], [1, 1]])  # (B, T) position buckets
    with torch.no_grad(), recorder.domain(1), routing.units(token_mask=torch.ones(2, 2, dtype=torch.bool),
                                                            token_labels=labels):
        routing.record("layer", experts=torch.tensor([[0], [1], [1], [1]]), num_experts=2)  # 4 = B*T units
        routing.record("layer", experts=torch.tensor([[0], [0], [1]]), num_experts=2)       # 3: not B*u
    summary = recorder.compositions()["layer"]
    expected = effective_compositions([0, 1, 1, 1], [[1, 0], [1, 1], [1, 1], [1, 1]]).n_eff
    # controlled figures: route 0 holds one unit (no unbiased index); route 1's three units share one
    # composition (index 1); the population holds 1 and 3 units of two compositions: S_pop = 6/12
    assert summary == {"n_eff": pytest.approx(expected), "routes": 2, "compositions": 2, "units": 4,
                       "unlabelled": 3, "n_eff_unbiased": 1.0, "n_eff_null": 2.0, "n_eff_excess": -1.0}
    assert "unlabelled" not in recorder.compositions([0]).get("layer", {})

    counter = CompositionCounter()
    counter.update(torch.tensor([[0], [1]]), 0, labels=torch.tensor([[3], [4]]))
    with pytest.raises(ValueError, match="compositions changed from 1 labels to 0"):
        counter.update(torch.tensor([[0]]), 0)
    with pytest.raises(ValueError, match="compositions changed"):
        counter.merge({(1, 0): 2}, 1)


def test_a_subspace_id_is_part_of_each_units_route():
    """A layer whose experts run under one of several parameter subsets (MoSEs' task masks) reports
    the subset per unit: two tasks' tokens on the same expert are two routes, each carrying its
    own task's compositions, while utilization still counts the expert."""
    from clbench.metrics import effective_compositions

    recorder = RoutingRecorder(num_domains=2, keep_routes=True, compositions=True)
    experts = torch.tensor([[1], [1], [1], [1]])           # every unit on expert 1
    subspace = torch.tensor([0, 0, 1, 1])                  # under task 0's masks, then task 1's
    for domain, rows in ((0, slice(0, 2)), (1, slice(2, 4))):
        with torch.no_grad(), recorder.domain(domain):
            routing.record("layer", experts=experts[rows], num_experts=2, subspace=subspace[rows])
    summary = recorder.compositions()["layer"]
    assert summary["routes"] == 2 and summary["n_eff"] == pytest.approx(1.0)
    # without the subspace the same units are one route mixing both domains
    assert effective_compositions(experts, [0, 0, 1, 1]).n_eff == pytest.approx(2.0)
    domains, routes = recorder.routes("layer")
    assert routes.tolist() == [[0, 1], [0, 1], [1, 1], [1, 1]] and domains.tolist() == [0, 0, 1, 1]
    assert recorder.compute()["layer"]["utilization"][:, 1].tolist() == [1.0, 1.0]
    with recorder.domain(0), pytest.raises(ValueError, match="subspace has 1 units but experts 2"):
        routing.record("layer", experts=experts[:2], num_experts=2, subspace=subspace[:1])
