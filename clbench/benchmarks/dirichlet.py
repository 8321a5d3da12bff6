"""Dirichlet class-imbalanced partitions of any labelled dataset.

The training set is cut into ``P`` disjoint experiences. For every class ``c`` the share of its
samples that goes to each experience is drawn from ``Dir_P(alpha)`` (small ``alpha``: a class
sits mostly in one or two experiences; large ``alpha``: close to uniform). This is the
per-class ("label-skew") form of Hsu, Qi & Brown (2019) that federated-learning code uses with
a ``min_size`` re-draw, which is what the thesis's settings (``min_size=1400``,
``balanced=true``) point to.

Choices the sources leave open, and what is done here:

* ``balanced``: while drawing a class's shares, experiences that already hold at least
  ``N / P`` samples get share 0, so experience *sizes* stay comparable while their class
  mixes stay skewed.
* ``min_size``: the whole draw is repeated (same generator, so still a pure function of the
  seed) until every experience holds at least ``min_size`` samples; after ``max_tries``
  draws it fails with a message that says what to change.
* Test split: each class's test samples are cut with the *same per-class fractions* as its
  training samples, so every experience's test split follows its training class proportions
  and every test sample is used exactly once.
* Global test set: a class-balanced subsample of the whole test split (each class cut to
  the rarest class's count), for G-mean and MAUC over all classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np
from pydantic import Field

from clbench.config.validation import ArgumentError

# The split's arguments as every Dirichlet benchmark declares them (checked from the config).
NumExperiences = Annotated[int, Field(ge=1)]
Alpha = Annotated[float, Field(gt=0)]  # the concentration: small is skewed
MinSize = Annotated[int, Field(ge=0)]


@dataclass
class DirichletSplit:
    train_indices: list[np.ndarray]  # one index array per experience
    test_indices: list[np.ndarray]
    global_test_indices: np.ndarray
    proportions: np.ndarray  # (P, C): share of class c's training samples in experience p


def _cut(indices: np.ndarray, fractions: np.ndarray) -> list[np.ndarray]:
    """Split ``indices`` into len(fractions) consecutive pieces with the given fractions."""
    bounds = (np.cumsum(fractions)[:-1] * len(indices)).round().astype(int)
    return np.split(indices, bounds)


def dirichlet_split(train_labels, test_labels, *, num_experiences: NumExperiences = 5, alpha: Alpha = 0.3,
                    min_size: MinSize = 1, balanced: bool = False, seed: int = 0,
                    max_tries: int = 1000) -> DirichletSplit:
    """Partition train/test label arrays into ``num_experiences`` Dirichlet-skewed experiences.

    The arguments are a benchmark's ``init_args`` (its signature declares their ranges); what
    does not fit the labels is refused here, at that benchmark's field."""
    train_labels = np.asarray(train_labels)
    test_labels = np.asarray(test_labels)
    n, P = len(train_labels), num_experiences
    if P > n:
        raise ArgumentError("benchmark", "num_experiences", f"{P} experiences cannot be cut from {n} training samples",
                            fix=f"set num_experiences <= {n}")
    if min_size * P > n:
        raise ArgumentError("benchmark", "min_size", f"min_size={min_size} x {P} experiences exceeds the {n} training "
                            "samples", fix=f"set min_size <= {n // P}")
    classes = np.unique(np.concatenate([train_labels, test_labels]))
    rng = np.random.default_rng(seed)
    by_class = {c: rng.permutation(np.flatnonzero(train_labels == c)) for c in classes}
    test_by_class = {c: rng.permutation(np.flatnonzero(test_labels == c)) for c in classes}

    for _ in range(max_tries):
        sizes = np.zeros(P, dtype=int)
        props = np.zeros((P, len(classes)))
        pieces: list[list[np.ndarray]] = [[] for _ in range(P)]
        for k, c in enumerate(classes):
            share = rng.dirichlet(np.full(P, alpha))
            if balanced:
                share = share * (sizes < n / P)
                share = share / share.sum() if share.sum() > 0 else np.full(P, 1.0 / P)
            for p, part in enumerate(_cut(by_class[c], share)):
                pieces[p].append(part)
                sizes[p] += len(part)
            props[:, k] = share
        if sizes.min() >= min_size:
            break
    else:
        raise ArgumentError("benchmark", "min_size", f"no Dirichlet draw gave every experience >= {min_size} samples "
                            f"in {max_tries} tries (alpha={alpha}, {P} experiences, {n} samples)",
                            fix="lower min_size, raise alpha, or set balanced: true")

    train_parts = [np.sort(np.concatenate(p)) for p in pieces]
    if min(len(idx) for idx in train_parts) == 0:
        empty = [p for p, idx in enumerate(train_parts) if len(idx) == 0]
        raise ArgumentError("benchmark", "min_size", f"the Dirichlet split left experience(s) {empty} empty",
                            fix="set min_size >= 1")
    # Realised per-class fractions (after rounding) drive the test cut.
    counts = np.array([[int((train_labels[idx] == c).sum()) for c in classes] for idx in train_parts])
    totals = counts.sum(axis=0)
    test_pieces: list[list[np.ndarray]] = [[] for _ in range(P)]
    for k, c in enumerate(classes):
        fractions = counts[:, k] / totals[k] if totals[k] else np.full(P, 1.0 / P)
        for p, part in enumerate(_cut(test_by_class[c], fractions)):
            test_pieces[p].append(part)
    test_parts = [np.sort(np.concatenate(p)) for p in test_pieces]
    empty = [p for p, idx in enumerate(test_parts) if len(idx) == 0]
    if empty:
        raise ArgumentError("benchmark", "min_size", f"experience(s) {empty} received no test samples",
                            fix="raise min_size or alpha so every experience holds enough of some class")

    per_class = min(len(test_by_class[c]) for c in classes)
    global_test = np.sort(np.concatenate([test_by_class[c][:per_class] for c in classes]))
    proportions = counts / np.maximum(totals, 1)
    return DirichletSplit(train_parts, test_parts, global_test, proportions)
