"""Continual-learning streams on Fashion-MNIST (read by :mod:`clbench.benchmarks.fashion_mnist`).

The protocols continual-learning papers run on MNIST, on its drop-in replacement:

* ``fashion-mnist-split``: Split Fashion-MNIST, the ten classes in five experiences of two
  (T-shirt/Trouser, Pullover/Dress, Coat/Sandal, Shirt/Sneaker, Bag/Ankle boot), as Split MNIST
  in van de Ven and Tolias (2019), "Three scenarios for continual learning". ``scenario:
  class-il`` (default) scores one 10-way output; ``scenario: task-il`` is the task-incremental
  variant: the experiences carry their task label (0..4) in the Avalanche datasets, and the
  classification objective restricts the logits to the classes of the sample's task, in
  training and at test (the multi-headed output of that paper, on one shared head).
* ``fashion-mnist-rotated``: domain-incremental, every experience the same images rotated by one
  angle (Rotated MNIST, Lopez-Paz and Ranzato 2017), all ten classes in each.
* ``fashion-mnist-permuted``: domain-incremental, one fixed pixel permutation per experience
  (Permuted MNIST, Goodfellow et al. 2013; the first experience unpermuted, as in van de Ven and
  Tolias's code).
* ``fashion-mnist-dirichlet``: the training set cut into Dirichlet-skewed class-imbalanced
  partitions (:mod:`clbench.benchmarks.dirichlet`), with a balanced global test set.

The images stay uint8 tensors of shape (N, 1, 28, 28) in memory (rotated and permuted copies
are made once, when the stream is built); each batch is scaled to [0, 1] as one tensor
operation (:func:`to_unit`), so nothing is decoded per sample. ``train_per_class`` and
``test_per_class`` take a seeded class-stratified subsample of the official splits, which is
how a suite fits a small CPU; ``null`` keeps all 6,000 / 1,000 images per class.
``validation_per_class`` scores a run on that many training images per class, held out of
training, instead of the test set: the split hyper-parameter searches use (:func:`load_tensors`).
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import AfterValidator, Field

from clbench.benchmarks.dirichlet import Alpha, MinSize, NumExperiences, dirichlet_split
from clbench.benchmarks.fashion_mnist import CLASS_NAMES, SIDE, Verify, load
from clbench.config.validation import ArgumentError, distinct
from clbench.data.datasets import ArrayDataset
from clbench.data.streams import StreamSpec, build_scenario

SPLIT_TASKS = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
DEFAULT_ANGLES = (0, 45, 90, 135, 180)
INPUT_SHAPE = (1, SIDE, SIDE)
PerClass = Annotated[int, Field(ge=1)] | None
ClassId = Annotated[int, Field(ge=0, le=9)]


def to_unit(x: torch.Tensor) -> torch.Tensor:
    """A uint8 batch as float32 in [0, 1] (the batch-level transform of every split)."""
    return x.to(torch.float32).div_(255.0)


def subsample(labels: np.ndarray, per_class: int | None, seed: int) -> np.ndarray:
    """Sorted positions of ``per_class`` samples of each class, drawn with ``seed`` (all when None)."""
    if per_class is None:
        return np.arange(len(labels))
    rng = np.random.default_rng(seed)
    keep = [rng.permutation(np.flatnonzero(labels == c))[:per_class] for c in np.unique(labels)]
    return np.sort(np.concatenate(keep))


def load_tensors(root: str | None, train_per_class: int | None, test_per_class: int | None, seed: int,
                 verify: Verify, validation_per_class: int | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test): x uint8 (N, 1, 28, 28), y int64, subsampled per class.

    With ``validation_per_class``, the "test" pair is a seeded class-stratified validation set
    carved out of the official training set, and the training pair is what is left of it: the
    split that hyper-parameters are chosen on, which never reads the official test images.
    """
    if validation_per_class is not None and test_per_class is not None:
        raise ArgumentError("benchmark", "test_per_class", "subsamples the official test set, which a run with "
                            "validation_per_class does not read", fix="leave test_per_class out (or null)")
    data = load(root, verify)
    x_train, y_train, x_test, y_test = data.x_train, data.y_train, data.x_test, data.y_test
    if validation_per_class is not None:
        held = subsample(y_train, validation_per_class, seed + 2)
        rest = np.setdiff1d(np.arange(len(y_train)), held)
        x_train, y_train, x_test, y_test = x_train[rest], y_train[rest], x_train[held], y_train[held]
    out = []
    for x, y, n, part in ((x_train, y_train, train_per_class, 0), (x_test, y_test, test_per_class, 1)):
        idx = subsample(y, n, seed + part)
        out += [torch.from_numpy(x[idx]).unsqueeze(1), torch.from_numpy(y[idx])]
    return tuple(out)


def _spec(name: str, scenario_type: str, **kw) -> StreamSpec:
    return StreamSpec(name=name, num_classes=10, input_shape=INPUT_SHAPE, scenario_type=scenario_type,
                      class_names=list(CLASS_NAMES), **kw)


def fashion_mnist_split(root: str | None = None,
                        tasks: Annotated[list[Annotated[list[ClassId], Field(min_length=1)]],
                                         Field(min_length=1)] | None = None,
                        scenario: Literal["class-il", "task-il"] = "class-il",
                        train_per_class: PerClass = None, test_per_class: PerClass = None, subsample_seed: int = 0,
                        validation_per_class: PerClass = None, verify: Verify = "md5"):
    """Split Fashion-MNIST: one experience per entry of ``tasks`` (default five pairs of classes)."""
    tasks = [list(t) for t in (tasks if tasks is not None else SPLIT_TASKS)]
    flat = [c for t in tasks for c in t]
    if len(set(flat)) != len(flat):
        raise ArgumentError("benchmark", "tasks", "a class is in more than one task",
                            fix="give each class to one task, e.g. [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]")
    x_tr, y_tr, x_te, y_te = load_tensors(root, train_per_class, test_per_class, subsample_seed, verify,
                                          validation_per_class)
    train, test = [], []
    for classes in tasks:
        tr, te = torch.isin(y_tr, torch.tensor(classes)), torch.isin(y_te, torch.tensor(classes))
        train.append(ArrayDataset(x_tr[tr], y_tr[tr], to_unit))
        test.append(ArrayDataset(x_te[te], y_te[te], to_unit))
    names = ["c" + "-".join(map(str, t)) for t in tasks]
    task_il = scenario == "task-il"
    spec = _spec("fashion-mnist-split" + ("-task" if task_il else ""), scenario)
    return build_scenario(spec, train, test, names=names, classes=tasks,
                          task_labels=list(range(len(tasks))) if task_il else None)


fashion_mnist_split.objective = "classification"  # the stream's objective, known before it is built (preflight)


def rotate(x: torch.Tensor, angle: float) -> torch.Tensor:
    """uint8 images (N, 1, H, W) rotated counter-clockwise by ``angle`` degrees about their
    centre (bilinear, corners filled with 0, the background)."""
    if angle % 360 == 0:
        return x.clone()
    if angle % 90 == 0:
        return torch.rot90(x, int(angle // 90) % 4, dims=(-2, -1)).contiguous()
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2.functional import rotate as tv_rotate

    return tv_rotate(x, float(angle), interpolation=InterpolationMode.BILINEAR).contiguous()


def fashion_mnist_rotated(root: str | None = None,
                          angles: Annotated[list[float], Field(min_length=1), AfterValidator(distinct)] | None = None,
                          train_per_class: PerClass = None, test_per_class: PerClass = None, subsample_seed: int = 0,
                          validation_per_class: PerClass = None, verify: Verify = "md5"):
    """Rotated Fashion-MNIST: one experience per angle in ``angles`` (degrees), the same images in each."""
    angles = list(angles) if angles is not None else list(DEFAULT_ANGLES)
    x_tr, y_tr, x_te, y_te = load_tensors(root, train_per_class, test_per_class, subsample_seed, verify,
                                          validation_per_class)
    names = [f"rot{a:g}" for a in angles]
    if len(set(names)) != len(names):
        raise ArgumentError("benchmark", "angles", f"angles {angles} name the same experience twice",
                            fix="list each angle once")
    train = [ArrayDataset(rotate(x_tr, a), y_tr, to_unit) for a in angles]
    test = [ArrayDataset(rotate(x_te, a), y_te, to_unit) for a in angles]
    return build_scenario(_spec("fashion-mnist-rotated", "domain-il"), train, test, names=names,
                          classes=[list(range(10))] * len(angles))


fashion_mnist_rotated.objective = "classification"  # the stream's objective, known before it is built (preflight)


def permutations(num: int, seed: int, pixels: int = SIDE * SIDE) -> list[np.ndarray]:
    """``num`` pixel permutations drawn with ``seed``; the first is the identity."""
    rng = np.random.default_rng(seed)
    return [np.arange(pixels)] + [rng.permutation(pixels) for _ in range(num - 1)]


def permute(x: torch.Tensor, perm: np.ndarray) -> torch.Tensor:
    flat = x.reshape(len(x), -1)[:, torch.from_numpy(perm)]
    return flat.reshape(x.shape).contiguous()


def fashion_mnist_permuted(root: str | None = None, num_experiences: NumExperiences = 5, permutation_seed: int = 0,
                           train_per_class: PerClass = None, test_per_class: PerClass = None, subsample_seed: int = 0,
                           validation_per_class: PerClass = None, verify: Verify = "md5"):
    """Permuted Fashion-MNIST: ``num_experiences`` fixed pixel permutations (the first the identity)."""
    x_tr, y_tr, x_te, y_te = load_tensors(root, train_per_class, test_per_class, subsample_seed, verify,
                                          validation_per_class)
    perms = permutations(num_experiences, permutation_seed)
    train = [ArrayDataset(permute(x_tr, p), y_tr, to_unit) for p in perms]
    test = [ArrayDataset(permute(x_te, p), y_te, to_unit) for p in perms]
    scenario = build_scenario(_spec("fashion-mnist-permuted", "domain-il"), train, test,
                              names=[f"perm{i}" for i in range(num_experiences)],
                              classes=[list(range(10))] * num_experiences)
    scenario.permutations = perms  # pixel order of each experience (flattened 28x28)
    return scenario


fashion_mnist_permuted.objective = "classification"  # the stream's objective, known before it is built (preflight)


def fashion_mnist_dirichlet(root: str | None = None, num_experiences: NumExperiences = 5, alpha: Alpha = 0.3,
                            min_size: MinSize = 20, balanced: bool = False, partition_seed: int = 0,
                            train_per_class: PerClass = None, test_per_class: PerClass = None, subsample_seed: int = 0,
                            validation_per_class: PerClass = None, verify: Verify = "md5"):
    """Class-imbalanced Fashion-MNIST: Dirichlet(``alpha``) partitions of the training split."""
    x_tr, y_tr, x_te, y_te = load_tensors(root, train_per_class, test_per_class, subsample_seed, verify,
                                          validation_per_class)
    split = dirichlet_split(y_tr.numpy(), y_te.numpy(), num_experiences=num_experiences, alpha=alpha,
                            min_size=min_size, balanced=balanced, seed=partition_seed)
    train = [ArrayDataset(x_tr[idx], y_tr[idx], to_unit) for idx in split.train_indices]
    test = [ArrayDataset(x_te[idx], y_te[idx], to_unit) for idx in split.test_indices]
    g = split.global_test_indices
    spec = _spec("fashion-mnist-dirichlet", "instance-il", global_test=ArrayDataset(x_te[g], y_te[g], to_unit),
                 imbalance_metrics=True)
    scenario = build_scenario(spec, train, test, names=[f"part{p}" for p in range(num_experiences)])
    scenario.dirichlet = split  # indices into the (subsampled) train / test tensors, class proportions
    return scenario


fashion_mnist_dirichlet.objective = "classification"  # the stream's objective, known before it is built (preflight)
