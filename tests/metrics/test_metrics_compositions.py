"""Route-wise effective composition number N_eff against hand-worked values and direct counts."""

from collections import Counter, defaultdict

import numpy as np
import pytest
import torch

from clbench.metrics import effective_compositions


def _direct(routes, comps):
    by_route = defaultdict(Counter)
    for r, c in zip(map(tuple, routes), map(tuple, comps)):
        by_route[r][c] += 1
    n = len(routes)
    total = 0.0
    per_route = {}
    for r, counter in by_route.items():
        size = sum(counter.values())
        per_route[r] = 1.0 / sum((v / size) ** 2 for v in counter.values())
        total += size / n * per_route[r]
    return total, per_route


def test_hand_worked_two_routes():
    # route 0 carries one composition (N_eff = 1); route 1 carries two in equal shares (2)
    routes = [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]
    comps = [7, 7, 7, 7, 3, 3, 3, 5, 5, 5]
    out = effective_compositions(routes, comps)
    assert out.route_n_eff.tolist() == [1.0, 2.0]
    assert out.route_mass.tolist() == [0.4, 0.6]
    assert out.n_eff == pytest.approx(0.4 * 1 + 0.6 * 2)
    assert out.num_compositions == 3
    # 3:1 split: 1 / (0.75^2 + 0.25^2) = 1.6
    assert effective_compositions([0] * 4, [1, 1, 1, 2]).n_eff == pytest.approx(1.6)


@pytest.mark.parametrize("seed", range(3))
def test_random_tuples_match_direct_counting(seed):
    rng = np.random.default_rng(seed)
    routes = rng.integers(0, 4, size=(3000, 2))           # e.g. per-head expert choices
    comps = np.stack([rng.integers(0, 2, 3000), rng.integers(0, 3, 3000),
                      rng.integers(0, 5, 3000)], 1)        # (domain, stance, frequency bucket)
    comps[routes[:, 0] == 0, 1:] = 0                        # one route family is purer
    expected, per_route = _direct(routes, comps)
    out = effective_compositions(torch.tensor(routes), torch.tensor(comps))
    assert out.n_eff == pytest.approx(expected, rel=1e-12)
    for key, value in zip(map(tuple, out.routes), out.route_n_eff):
        assert value == pytest.approx(per_route[key], rel=1e-12)


def test_unordered_routes_merge_permuted_sets_and_weights_scale():
    routes = np.array([[1, 2], [2, 1], [1, 2], [0, 3]])
    comps = np.array([0, 1, 1, 0])
    ordered = effective_compositions(routes, comps)
    merged = effective_compositions(routes, comps, unordered_routes=True)
    assert len(ordered.routes) == 3 and len(merged.routes) == 2
    expected, _ = _direct(np.sort(routes, 1), comps[:, None])
    assert merged.n_eff == pytest.approx(expected)
    # integer weights act like repeated units
    weights = np.array([2, 1, 1, 3])
    repeated = effective_compositions(np.repeat(routes, weights, 0), np.repeat(comps, weights),
                                      unordered_routes=True)
    weighted = effective_compositions(routes, comps, unordered_routes=True, weights=weights)
    assert weighted.n_eff == pytest.approx(repeated.n_eff)


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="units"):
        effective_compositions([0, 1], [0])
    with pytest.raises(ValueError, match="at least one"):
        effective_compositions([], [])
