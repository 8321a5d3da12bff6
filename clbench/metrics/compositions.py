"""Route-wise effective composition number N_eff (MH-MoE, Sec. 2.3, Eqs. 7-9), and the same
controlled for the route space's size: bias-corrected, beside its exact shuffled-label null."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Compositions:
    """Result of :func:`effective_compositions`.

    ``n_eff``: the mass-weighted mean ``sum_r mass(r) N_eff(r)`` (the per-layer figure).
    ``routes``: the distinct routes, one per row (shape ``(R, k)``); ``route_n_eff``,
    ``route_mass`` and ``route_counts`` are aligned with them. ``num_compositions``: the number
    of distinct compositions seen overall.
    """

    n_eff: float
    routes: np.ndarray
    route_n_eff: np.ndarray
    route_mass: np.ndarray
    route_counts: np.ndarray
    num_compositions: int


def _rows(values: Any, name: str) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2:
        raise ValueError(f"{name} must have shape (N,) or (N, m), got {array.shape}")
    return array


def effective_compositions(routes: Any, compositions: Any, *, unordered_routes: bool = False,
                           weights: Any = None) -> Compositions:
    """N_eff(r) = 1 / sum_c p(c|r)^2 per route, and its route-mass-weighted mean.

    ``routes``: one route per routing unit (token), shape ``(N,)`` for top-1 expert ids or
    ``(N, k)`` for a tuple (MH-MoE's per-head choices; a top-k set with
    ``unordered_routes=True``, which sorts each row so that {2, 5} and {5, 2} are one route).
    ``compositions``: one composition per unit, ``(N,)`` ids or ``(N, m)`` feature labels
    (domain, stance, frequency bucket, position bucket, ...); equal rows are one composition.
    ``weights``: optional non-negative per-unit weights (default 1 each).

    p(c|r) is estimated by (weighted) counts within route r; mass(r) is r's share of all units,
    so the mean is ``sum_r mass(r) N_eff(r)`` (the paper's "old-task mass-weighted average";
    the exact formula is an inference from its wording). N_eff(r) is the inverse Simpson index
    (the order-2 Hill number): 1 when a route carries one composition, m when it carries m in
    equal shares. Pass the units of the old task to get the paper's figure.
    """
    r = _rows(routes, "routes")
    c = _rows(compositions, "compositions")
    if r.shape[0] != c.shape[0]:
        raise ValueError(f"routes has {r.shape[0]} units but compositions {c.shape[0]}")
    n = r.shape[0]
    w = np.ones(n) if weights is None else np.asarray(
        weights.detach().cpu().numpy() if hasattr(weights, "detach") else weights, dtype=float)
    if w.shape != (n,) or (w < 0).any() or not np.isfinite(w).all():
        raise ValueError("weights must be finite, non-negative and one per unit")
    if n == 0 or w.sum() == 0:
        raise ValueError("effective_compositions needs at least one unit with positive weight")
    if unordered_routes:
        r = np.sort(r, axis=1)
    route_keys, route_id = np.unique(r, axis=0, return_inverse=True)
    comp_keys, comp_id = np.unique(c, axis=0, return_inverse=True)
    route_id, comp_id = route_id.reshape(-1), comp_id.reshape(-1)
    num_routes, num_comps = len(route_keys), len(comp_keys)
    # Joint (route, composition) weights without a dense R x C table.
    pair, pair_id = np.unique(route_id * num_comps + comp_id, return_inverse=True)
    pair_w = np.bincount(pair_id.reshape(-1), weights=w, minlength=len(pair))
    route_w = np.bincount(route_id, weights=w, minlength=num_routes)
    squares = np.bincount(pair // num_comps, weights=pair_w ** 2, minlength=num_routes)
    with np.errstate(divide="ignore", invalid="ignore"):
        route_n_eff = np.where(squares > 0, route_w ** 2 / squares, np.nan)
    mass = route_w / route_w.sum()
    used = mass > 0
    return Compositions(
        n_eff=float(np.sum(mass[used] * route_n_eff[used])),
        routes=route_keys,
        route_n_eff=route_n_eff,
        route_mass=mass,
        route_counts=np.bincount(route_id, minlength=num_routes),
        num_compositions=num_comps,
    )


@dataclass(frozen=True)
class ControlledCompositions:
    """N_eff controlled for the size of the route space (:func:`controlled_compositions`).

    ``n_eff_unbiased``: 1 / the mass-weighted mean over routes of the unbiased Simpson index
    ``sum_c n_rc (n_rc - 1) / (n_r (n_r - 1))``; ``n_eff_null``: the same under no association
    between routes and compositions (labels permuted among the measured units), ``1 / S_pop`` with
    ``S_pop = sum_c K_c (K_c - 1) / (N (N - 1))``; ``excess``: their difference (about 0 when
    routes carry compositions as a random draw would, whatever the number of routes);
    ``units_used``: the units in routes of two or more (a route of one unit has no estimate).
    """

    n_eff_unbiased: float | None
    n_eff_null: float | None
    excess: float | None
    units_used: int


def controlled_compositions(route_id: np.ndarray, comp_id: np.ndarray, counts: np.ndarray) -> ControlledCompositions:
    """N_eff with the two controls its plug-in form lacks, from (route, composition, count) triples.

    **Bias.** The plug-in ``1 / sum_c p(c|r)^2`` of a route with few units is too low: with n_r
    units, E[sum p^2] = S + (1 - S) / n_r. Routes of a larger route space hold fewer units each,
    so the plug-in N_eff falls with the number of routes even where routing ignores compositions
    (MH-MoE's Fig. 6 controls for route-space size for this reason). The unbiased Simpson index
    ``n_rc (n_rc - 1) / (n_r (n_r - 1))`` has expectation S for any n_r >= 2.

    **Null.** Permuting the composition labels among the measured units (route and composition
    totals fixed) draws each route's units without replacement from the whole population, and
    then E[unbiased Simpson of r] = S_pop exactly, for every route: the mass-weighted mean's null
    expectation is S_pop, so ``n_eff_null = 1 / S_pop``. The inverse of a mean of Simpson indices
    (not the paper's mean of inverses) is taken so that the null of that mean is exact (its
    inverse is then biased up by Jensen's inequality, by a relative ~Var/S_pop^2, small once the
    routes hold hundreds of units); the paper's figure stays ``n_eff``. A route of one unit has no unbiased index and is left out (``units_used``).
    """
    route_id, comp_id = np.asarray(route_id), np.asarray(comp_id)
    counts = np.asarray(counts, dtype=float)
    route_n = np.bincount(route_id, weights=counts)
    pairs = np.bincount(route_id, weights=counts * (counts - 1), minlength=len(route_n))
    comp_n = np.bincount(comp_id, weights=counts)
    total = counts.sum()
    usable = route_n >= 2
    used = float(route_n[usable].sum())
    if not usable.any() or total < 2:
        return ControlledCompositions(None, None, None, int(used))
    simpson = pairs[usable] / (route_n[usable] * (route_n[usable] - 1))
    mean_simpson = float(np.sum(route_n[usable] * simpson) / used)
    pop_simpson = float(np.sum(comp_n * (comp_n - 1)) / (total * (total - 1)))
    unbiased = 1.0 / mean_simpson if mean_simpson > 0 else None
    null = 1.0 / pop_simpson if pop_simpson > 0 else None
    excess = unbiased - null if unbiased is not None and null is not None else None
    return ControlledCompositions(unbiased, null, excess, int(used))


class CompositionCounter:
    """Weighted counts of (route, composition) pairs of one layer, accumulated batch by batch.

    Keeping every unit's route would grow with the evaluated tokens times the layers (millions
    of rows for an LLM with adapters in every projection); distinct pairs are few, so each batch
    is reduced with ``torch.unique`` and folded into a dict. A route is the sorted tuple of the
    unit's expert indices (a top-k set, or MH-MoE's per-head choices, which are numbered so that
    sorting keeps head order), after the unit's subspace id where the layer has several parameter
    subsets (MoSEs' task masks); a composition is ``(domain, *labels)``.
    """

    def __init__(self) -> None:
        self.pairs: dict[tuple[int, ...], int] = {}
        self.width: int | None = None  # route length: k, or 1 + k with a subspace id
        self.composition_width: int | None = None  # 1 + the number of labels
        self.unlabelled: dict[int, int] = {}  # per domain: units recorded without their labels

    def update(self, routes: Any, domain: int, *, labels: Any = None, keep: Any = None,
               subspace: Any = None) -> None:
        """``routes`` (N, k) expert indices; ``labels`` (N, m) or None; ``keep`` (N,) bool or None;
        ``subspace`` (N,) ids or None (then a route is its experts alone)."""
        import torch

        routes = routes.long().sort(-1).values  # on the layer's device: only the distinct rows come back
        if subspace is not None:
            routes = torch.cat([subspace.long().reshape(-1, 1), routes], 1)
        n = routes.shape[0]
        parts = [routes, torch.full((n, 1), int(domain), dtype=torch.long, device=routes.device)]
        if labels is not None:
            parts.append(labels.long())
        rows = torch.cat(parts, 1)
        if keep is not None:
            rows = rows[keep]
        if self.width is None:
            self.width = routes.shape[1]
        elif self.width != routes.shape[1]:
            raise ValueError(f"a layer's routes changed width from {self.width} to {routes.shape[1]}")
        self._check_compositions(rows.shape[1] - self.width)
        if rows.shape[0] == 0:
            return
        unique, counts = torch.unique(rows, dim=0, return_counts=True)
        for row, count in zip(unique.tolist(), counts.tolist()):
            key = tuple(row)
            self.pairs[key] = self.pairs.get(key, 0) + count

    def _check_compositions(self, width: int) -> None:
        """One layer's compositions are all (domain, *the same labels): N_eff's p(c|r) compares
        them, and a shorter tuple would be a different composition for no reason in the data."""
        if self.composition_width is None:
            self.composition_width = width
        elif self.composition_width != width:
            raise ValueError(f"a layer's compositions changed from {self.composition_width - 1} labels to "
                             f"{width - 1}: record units without labels with skip(), not as compositions")

    def skip(self, domain: int, units: int) -> None:
        """Count ``units`` of ``domain`` whose labels are unknown (left out of N_eff, reported)."""
        if units:
            self.unlabelled[int(domain)] = self.unlabelled.get(int(domain), 0) + int(units)

    def merge(self, pairs: dict[tuple[int, ...], int], width: int | None,
              unlabelled: dict[int, int] | None = None) -> None:
        """Add another counter's pairs (another process's shard of the same layer)."""
        for domain, units in (unlabelled or {}).items():
            self.skip(domain, units)
        if width is None:
            return
        if self.width is not None and self.width != width:
            raise ValueError(f"cannot merge routes of width {width} into width {self.width}")
        self.width = width
        for key, count in pairs.items():
            self._check_compositions(len(key) - width)
            self.pairs[key] = self.pairs.get(key, 0) + count

    def summary(self, domains: Any = None) -> dict[str, float] | None:
        """``{"n_eff", "routes", "compositions", "units"}`` over the labelled units of ``domains``,
        with the controlled figures of :func:`controlled_compositions` (``n_eff_unbiased``,
        ``n_eff_null``, ``n_eff_excess``; None where undefined), plus ``"unlabelled"`` (the units
        left out) when there are any; None if there is no unit."""
        wanted = None if domains is None else {int(d) for d in domains}
        keys = [key for key in self.pairs if wanted is None or key[self.width] in wanted]
        if not keys:
            return None
        width = self.width
        routes = np.array([key[:width] for key in keys])
        compositions = np.array([key[width:] for key in keys])
        weights = np.array([self.pairs[key] for key in keys], dtype=float)
        figures = effective_compositions(routes, compositions, weights=weights)
        _, route_id = np.unique(routes, axis=0, return_inverse=True)
        _, comp_id = np.unique(compositions, axis=0, return_inverse=True)
        controlled = controlled_compositions(route_id.reshape(-1), comp_id.reshape(-1), weights)
        out = {"n_eff": figures.n_eff, "routes": int(len(figures.routes)),
               "compositions": int(figures.num_compositions), "units": int(weights.sum()),
               "n_eff_unbiased": controlled.n_eff_unbiased, "n_eff_null": controlled.n_eff_null,
               "n_eff_excess": controlled.excess}
        skipped = sum(n for d, n in self.unlabelled.items() if wanted is None or d in wanted)
        if skipped:
            out["unlabelled"] = skipped
        return out
