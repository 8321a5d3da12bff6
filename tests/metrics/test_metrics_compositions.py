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


# -- controlled for the route space's size -----------------------------------------------------
def _unit_table(routes: np.ndarray, comps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(route id, composition id, count) triples of per-unit ids, as CompositionCounter folds them."""
    keys, counts = np.unique(np.stack([routes, comps], 1), axis=0, return_counts=True)
    return keys[:, 0], keys[:, 1], counts


def test_without_association_the_excess_is_near_zero_whatever_the_number_of_routes():
    """Units routed at random: the plug-in N_eff falls as the route space grows (fewer units per
    route), the bias-corrected one stays at the null; the control, routes that follow the
    composition, gives an excess far below 0 in either route space."""
    from clbench.metrics.compositions import controlled_compositions

    rng = np.random.default_rng(0)
    units, kinds = 20_000, 6
    comps = rng.integers(0, kinds, units)
    plug_in, excess = {}, {}
    for num_routes in (4, 512):
        routes = rng.integers(0, num_routes, units)
        plug_in[num_routes] = effective_compositions(routes, comps).n_eff
        figures = controlled_compositions(*_unit_table(routes, comps))
        excess[num_routes] = figures.excess
        assert figures.n_eff_null == pytest.approx(kinds, rel=0.02)
        per_kind = max(1, num_routes // kinds)  # 4 routes: each carries one or two kinds
        following = (comps * per_kind + rng.integers(0, per_kind, units)) % num_routes
        assert controlled_compositions(*_unit_table(following, comps)).excess < -0.5 * kinds
    assert plug_in[4] - plug_in[512] > 0.3  # the plug-in figure moves with the route space alone
    assert abs(excess[4]) < 0.1 and abs(excess[512]) < 0.2


def test_the_null_is_the_mean_over_permuted_composition_labels():
    """n_eff_null is exact for the mean Simpson index: permuting the labels among the units gives
    on average 1 / n_eff_null (here within four Monte Carlo standard errors)."""
    from clbench.metrics.compositions import controlled_compositions

    rng = np.random.default_rng(1)
    routes = rng.integers(0, 40, 900)
    comps = np.where(rng.random(900) < 0.6, routes % 3, rng.integers(0, 5, 900))  # associated
    null = controlled_compositions(*_unit_table(routes, comps)).n_eff_null
    simpsons = [1 / controlled_compositions(*_unit_table(routes, rng.permutation(comps))).n_eff_unbiased
                for _ in range(400)]
    assert abs(np.mean(simpsons) - 1 / null) < 4 * np.std(simpsons) / np.sqrt(len(simpsons))
    assert controlled_compositions(*_unit_table(routes, comps)).excess < 0  # the association shows


def test_the_counter_reports_the_controlled_figures_beside_the_papers():
    import torch

    from clbench.metrics.compositions import CompositionCounter

    counter = CompositionCounter()
    routes = torch.tensor([[0], [0], [0], [1], [1], [1], [2]])
    counter.update(routes, 0, labels=torch.tensor([[0], [0], [1], [1], [1], [1], [0]]))
    out = counter.summary()
    assert set(out) >= {"n_eff", "n_eff_unbiased", "n_eff_null", "n_eff_excess"}
    # route 0: units (0, 0, 1): Simpson 2/6; route 1: (1, 1, 1): 1; route 2 (one unit) is left out
    assert out["n_eff_unbiased"] == pytest.approx(1 / ((3 * 2 / 6 + 3 * 1) / 6))
    # population: composition (0, 0) x3, (0, 1) x4 of 7 units
    assert out["n_eff_null"] == pytest.approx(1 / ((3 * 2 + 4 * 3) / (7 * 6)))
    assert out["n_eff_excess"] == pytest.approx(out["n_eff_unbiased"] - out["n_eff_null"])
