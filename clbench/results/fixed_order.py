"""An R matrix in the stream's own experience order, so that runs of different task orders line
up cell by cell: row "after X" and column X mean the same experience X in every run, which the
run-order matrix (row k: after the k-th stage) does not. Only what entries record is used (the
run's ``order`` and ``experiences``), never the stream itself, so a leaderboard renders without
its data or code."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from clbench.results.record import single_stage


def permutation(n: int, seed: int) -> list[int]:
    """The stream indices, in run order, that ``order: {permutation: seed}`` trains
    (drawn as :func:`clbench.data.streams.resolve_order` draws them)."""
    return [int(i) for i in np.random.default_rng(seed).permutation(n)]


def _from_order(entry: Mapping[str, Any]) -> list[str] | None:
    """The stream's order of names where the entry's order says how it was drawn from it."""
    order, names = entry.get("order"), list(entry.get("experiences") or [])
    if order == "default":
        return names
    if order == "reverse":
        return names[::-1]
    seed = order.get("permutation") if isinstance(order, Mapping) else None
    if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0:
        canonical: list[str] = [""] * len(names)
        for position, index in enumerate(permutation(len(names), seed)):
            canonical[index] = names[position]
        return canonical
    return None


def canonical_names(entries: Sequence[Mapping[str, Any]]) -> list[str] | None:
    """The stream's own experience order: a default run's names, a reverse run's reversed, a
    permutation run's put back, else the first run's (a suite's first order, e.g. TRACE's
    ``standard``). None when the runs do not train one set of distinct experiences (a stream
    drawn anew for each seed), where no fixed order exists."""
    if not entries:
        return None
    found = [names for names in map(_from_order, entries) if names is not None]
    names = found[0] if found else list(entries[0].get("experiences") or [])
    if not names or len(set(names)) != len(names):
        return None
    if any(sorted(e.get("experiences") or []) != sorted(names) for e in entries):
        return None
    return names


def fixed_order(entry: Mapping[str, Any], names: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """The entry's R (the untrained row first where recorded) with columns, and the rows of a
    multi-stage run, in the order of ``names``; and the rows' labels."""
    run = list(entry["experiences"])
    where = [run.index(n) for n in names]
    r = np.asarray(entry["r_matrix"], dtype=float)[:, where]
    if single_stage(entry):
        rows = ["after joint"]
    else:
        r = r[where]
        rows = [f"after {n}" for n in names]
    if entry.get("r_init") is not None:
        r = np.vstack([np.asarray(entry["r_init"], dtype=float)[where][None, :], r])
        rows = ["untrained", *rows]
    return r, rows


def mean_over_orders(entries: Sequence[Mapping[str, Any]], names: Sequence[str]) -> tuple[np.ndarray, list[str], int]:
    """The mean of the entries' fixed-order R over their orders (each order's runs, e.g. its
    seeds, averaged first, so an order with more seeds weighs no more); the rows' labels and the
    number of orders. The untrained row is kept only where every run recorded it."""
    every_init = all(e.get("r_init") is not None for e in entries)
    by_order: dict[str, list[np.ndarray]] = {}
    rows: list[str] = []
    for e in entries:
        r, rows = fixed_order(e if every_init else {**e, "r_init": None}, names)
        by_order.setdefault(str(e.get("order_label")), []).append(r)
    shapes = {r.shape for runs in by_order.values() for r in runs}
    if len(shapes) != 1:
        raise ValueError(f"runs of one row have R matrices of different shapes: {sorted(shapes)}")
    means = [np.mean(runs, axis=0) for runs in by_order.values()]
    return np.mean(means, axis=0), rows, len(means)
