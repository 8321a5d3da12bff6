"""The embedded default streams, built from scikit-learn's bundled handwritten digits.

1,797 grey-scale 8x8 images of the digits 0-9 ship inside scikit-learn, so these streams need
no download and run in minutes on a laptop CPU. Pixels are scaled from 0..16 to [0, 1]. The
train/test split is stratified by class and seeded.

* ``digits-domains``: domain-incremental. Each domain is a deterministic transform of the
  *whole* split (as in Rotated MNIST): the same digits, seen differently, all 10 classes in
  every domain.
* ``digits-dirichlet``: class-imbalanced. The training split is cut into ``num_experiences``
  Dirichlet-skewed partitions (:mod:`clbench.benchmarks.dirichlet`), with a balanced global test set.
"""

from __future__ import annotations

from typing import Annotated, Callable, Literal

import numpy as np
import torch
from pydantic import AfterValidator, Field

from clbench.benchmarks.dirichlet import Alpha, MinSize, NumExperiences, dirichlet_split
from clbench.benchmarks.images import TestFraction
from clbench.data.datasets import ArrayDataset
from clbench.data.streams import StreamSpec, build_scenario
from clbench.config.validation import distinct

DOMAIN_TRANSFORMS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "rot0": lambda x: x,
    "rot90": lambda x: torch.rot90(x, 1, dims=(-2, -1)),
    "rot180": lambda x: torch.rot90(x, 2, dims=(-2, -1)),
    "rot270": lambda x: torch.rot90(x, 3, dims=(-2, -1)),
    "invert": lambda x: 1.0 - x,
    "flip": lambda x: torch.flip(x, dims=(-1,)),
}
DEFAULT_DOMAINS = ("rot0", "rot90", "rot180", "rot270", "invert")
Domain = Literal[tuple(DOMAIN_TRANSFORMS)]


def load_digits_split(test_fraction: TestFraction, seed: int):
    """(x_train, y_train, x_test, y_test) as tensors, x of shape (N, 1, 8, 8) in [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[:, None]
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_fraction, stratify=y, random_state=seed)
    return torch.from_numpy(x_tr), torch.from_numpy(y_tr), torch.from_numpy(x_te), torch.from_numpy(y_te)


def digits_domains(domains: Annotated[list[Domain], Field(min_length=1), AfterValidator(distinct)] | None = None,
                   test_fraction: TestFraction = 0.25, split_seed: int = 0):
    """Domain-incremental digits: one experience per transform in ``domains``."""
    domains = list(domains) if domains is not None else list(DEFAULT_DOMAINS)
    x_tr, y_tr, x_te, y_te = load_digits_split(test_fraction, split_seed)
    train = [ArrayDataset(DOMAIN_TRANSFORMS[d](x_tr).contiguous(), y_tr) for d in domains]
    test = [ArrayDataset(DOMAIN_TRANSFORMS[d](x_te).contiguous(), y_te) for d in domains]
    spec = StreamSpec(name="digits-domains", num_classes=10, input_shape=(1, 8, 8), scenario_type="domain-il",
                      named_orders={"rotations-first": [d for d in domains if d.startswith("rot")]
                                    + [d for d in domains if not d.startswith("rot")]},
                      class_names=[str(i) for i in range(10)], imbalance_metrics=True)
    return build_scenario(spec, train, test, names=domains, classes=[list(range(10))] * len(domains))


digits_domains.objective = "classification"  # the stream's objective, known before it is built (preflight)


def digits_dirichlet(num_experiences: NumExperiences = 5, alpha: Alpha = 0.3, min_size: MinSize = 20,
                     balanced: bool = False, test_fraction: TestFraction = 0.25, split_seed: int = 0,
                     partition_seed: int = 0):
    """Class-imbalanced digits: Dirichlet(alpha) partitions of the training split."""
    x_tr, y_tr, x_te, y_te = load_digits_split(test_fraction, split_seed)
    split = dirichlet_split(y_tr.numpy(), y_te.numpy(), num_experiences=num_experiences, alpha=alpha,
                            min_size=min_size, balanced=balanced, seed=partition_seed)
    train = [ArrayDataset(x_tr[idx], y_tr[idx]) for idx in split.train_indices]
    test = [ArrayDataset(x_te[idx], y_te[idx]) for idx in split.test_indices]
    g = split.global_test_indices
    spec = StreamSpec(name="digits-dirichlet", num_classes=10, input_shape=(1, 8, 8), scenario_type="instance-il",
                      global_test=ArrayDataset(x_te[g], y_te[g]), class_names=[str(i) for i in range(10)],
                      imbalance_metrics=True)
    return build_scenario(spec, train, test, names=[f"part{p}" for p in range(num_experiences)])


digits_dirichlet.objective = "classification"  # the stream's objective, known before it is built (preflight)
