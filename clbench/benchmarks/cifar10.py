"""CIFAR-10 (Krizhevsky, 2009) as the thesis's Dirichlet class-imbalanced stream.

Read from the published python version, ``cifar-10-batches-py/``: ``data_batch_1`` ..
``data_batch_5`` (50,000 training images) and ``test_batch`` (10,000), pickles whose ``b"data"``
is an (N, 3072) uint8 array (channel-major 32x32 RGB) and ``b"labels"`` a list of ints, and
``batches.meta`` whose ``b"label_names"`` names the 10 classes. ``root`` is that folder or its
parent. The pickles are read with :mod:`clbench.data.safe_pickle` (no code runs, no call
allocates more than the file holds) and what they hold is checked before use: the data a
uint8 (N, 3072) array, every label an int in 0..9 (not a bool, float or string), one per image.

The training set is cut into ``num_experiences`` Dirichlet(``alpha``) label-skewed partitions
by :func:`clbench.benchmarks.dirichlet.dirichlet_split` with the thesis's settings (seeds_004 section
3.1 and appendix B: 5 partitions, alpha 0.3 or 0.5, ``min_size=1400``, ``balanced=true``). Each
partition's test split follows its training class mix, and the whole official test set, which
has 1,000 images of every class, is the balanced global test set for G-mean and MAUC.

Augmentations default to the thesis's CIFAR-10 set: flip, colour jitter, blur and noise, no
crop (its ``balancedcifar10testing`` runs add a random crop: set ``augment: {crop_scale: [0.8,
1.0]}``). Training images are augmented per sample from the in-memory uint8 array; test
splits are :class:`clbench.data.datasets.ArrayDataset` with a batch-aware transform.
"""

from __future__ import annotations

import reprlib
from pathlib import Path

import numpy as np
import torch

from clbench.benchmarks.dirichlet import Alpha, MinSize, NumExperiences, dirichlet_split
from clbench.benchmarks.image_transforms import (Augment, AugmentOverrides, batch_transform, image_transform,
                                                 resolve_augment)
from clbench.benchmarks.images import ImageArray, ImageSize, Normalization, dataset_root
from clbench.data import safe_pickle
from clbench.data.datasets import ArrayDataset
from clbench.errors import UserError
from clbench.data.streams import StreamSpec, build_scenario

FOLDER = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
FIX = "see docs/datasets.md: download cifar-10-python.tar.gz from the CIFAR page and extract it"
REEXTRACT = "re-extract cifar-10-python.tar.gz, downloaded from the CIFAR page"
MAX_FILE_BYTES = 64 << 20  # a batch of the official 10,000 images is 31 MB
DEFAULT_AUGMENT = Augment(crop_scale=None, flip=True, color_jitter=0.2, blur=0.2, noise=0.02)


def locate(root: str) -> Path:
    base = dataset_root(root, "CIFAR-10", f"point root at the {FOLDER} folder")
    if (base / FOLDER).is_dir():
        base = base / FOLDER
    missing = [str(base / name) for name in (*TRAIN_FILES, TEST_FILE, META_FILE) if not (base / name).is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more: {', '.join(Path(m).name for m in missing[1:])})" \
            if len(missing) > 1 else ""
        raise UserError(f"CIFAR-10 batch file missing{more}", where=missing[0], fix=FIX)
    return base


def _unpickle(path: Path) -> dict:
    data = safe_pickle.load(path, fix=REEXTRACT, encoding="bytes", max_bytes=MAX_FILE_BYTES)
    if not isinstance(data, dict):
        raise UserError(f"expected a pickled dict, got {type(data).__name__}", where=str(path), fix=REEXTRACT)
    return data


def _labels(raw: object, path: Path) -> np.ndarray:
    """``b"labels"`` as int64, each checked to be an int in 0..9 (not a bool, float or string,
    which ``np.asarray(..., dtype=np.int64)`` would truncate, parse or refuse with a traceback)."""
    if isinstance(raw, np.ndarray) and raw.ndim == 1 and raw.dtype.kind in "iu":
        bad = np.flatnonzero((raw < 0) | (raw > 9))
        if len(bad):
            raise UserError(f"label {bad[0]} is {raw[bad[0]]}, outside 0..9", where=str(path), fix=REEXTRACT)
        return raw.astype(np.int64)
    if not isinstance(raw, (list, tuple)):
        raise UserError(f"b'labels' is {_kind(raw)}, expected a list of ints in 0..9", where=str(path), fix=REEXTRACT)
    for i, v in enumerate(raw):
        if type(v) is not int and not isinstance(v, np.integer):
            raise UserError(f"label {i} is {reprlib.repr(v)} ({type(v).__name__}), expected an int in 0..9",
                            where=str(path), fix=REEXTRACT)
        if not 0 <= v <= 9:
            raise UserError(f"label {i} is {reprlib.repr(int(v))}, outside 0..9", where=str(path), fix=REEXTRACT)
    return np.array(raw, dtype=np.int64)


def _kind(value: object) -> str:
    shape = f" of shape {value.shape} and dtype {value.dtype}" if isinstance(value, np.ndarray) else ""
    return f"a {type(value).__name__}{shape}"


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 3, 32, 32) uint8, labels (N,) int64) of one pickled batch, checked."""
    data = _unpickle(path)
    if b"data" not in data or b"labels" not in data:
        raise UserError("batch has no b'data' / b'labels' keys", where=str(path),
                        fix="this is not the python version of CIFAR-10; download cifar-10-python.tar.gz")
    x = data[b"data"]
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3072:
        raise UserError(f"b'data' is {_kind(x)}, expected an (N, 3072) uint8 array", where=str(path), fix=REEXTRACT)
    y = _labels(data[b"labels"], path)
    if len(x) != len(y):
        raise UserError(f"b'data' has {len(x)} images but b'labels' {len(y)} labels", where=str(path), fix=REEXTRACT)
    return x.reshape(-1, 3, 32, 32), y


def _names(meta: dict, path: Path) -> list[str]:
    names = meta.get(b"label_names")
    if not isinstance(names, list) or len(names) != 10 or not all(isinstance(n, (bytes, str)) for n in names):
        raise UserError("b'label_names' is not a list of 10 names", where=str(path), fix=REEXTRACT)
    try:
        return [n.decode() if isinstance(n, bytes) else n for n in names]
    except UnicodeDecodeError as err:
        raise UserError(f"a class name is not UTF-8 ({err.reason})", where=str(path), fix=REEXTRACT) from None


def load(root: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(x_train, y_train, x_test, y_test, class names) from the python batches."""
    base = locate(root)
    parts = [read_batch(base / name) for name in TRAIN_FILES]
    x_test, y_test = read_batch(base / TEST_FILE)
    names = _names(_unpickle(base / META_FILE), base / META_FILE)
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), x_test, y_test, names)


def cifar10_dirichlet(root: str, num_experiences: NumExperiences = 5, alpha: Alpha = 0.3, min_size: MinSize = 1400,
                      balanced: bool = True, partition_seed: int = 0, image_size: ImageSize = 32,
                      augment: bool | AugmentOverrides = True, normalize: Normalization = "imagenet"):
    """CIFAR-10 cut into ``num_experiences`` Dirichlet(``alpha``) class-imbalanced partitions."""
    aug = resolve_augment(augment, DEFAULT_AUGMENT)
    x_tr, y_tr, x_te, y_te, class_names = load(root)
    split = dirichlet_split(y_tr, y_te, num_experiences=num_experiences, alpha=alpha, min_size=min_size,
                            balanced=balanced, seed=partition_seed)
    eval_tf = batch_transform(image_size, normalize)
    if aug is None:
        train_x = torch.from_numpy(x_tr)
        train = [ArrayDataset(train_x[idx], torch.from_numpy(y_tr[idx]), eval_tf) for idx in split.train_indices]
    else:
        train_tf = image_transform(image_size, aug, normalize, jitter_first=image_size > 32)
        train = [ImageArray(x_tr, idx, y_tr[idx], train_tf, channels_last=False) for idx in split.train_indices]
    test_x, test_y = torch.from_numpy(x_te), torch.from_numpy(y_te)
    test = [ArrayDataset(test_x[idx], test_y[idx], eval_tf) for idx in split.test_indices]
    g = torch.from_numpy(split.global_test_indices)
    spec = StreamSpec(name="cifar10-dirichlet", num_classes=10, input_shape=(3, image_size, image_size),
                      scenario_type="instance-il", global_test=ArrayDataset(test_x[g], test_y[g], eval_tf),
                      class_names=class_names, imbalance_metrics=True)
    scenario = build_scenario(spec, train, test, names=[f"part{p}" for p in range(num_experiences)])
    scenario.dirichlet = split  # the partition (indices into the official arrays, class proportions)
    return scenario


cifar10_dirichlet.objective = "classification"  # the stream's objective, known before it is built (preflight)
