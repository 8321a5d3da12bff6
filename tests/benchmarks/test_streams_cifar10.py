"""CIFAR-10's python batches as the thesis's Dirichlet class-imbalanced stream."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from clbench.benchmarks.cifar10 import cifar10_dirichlet, load
from clbench.benchmarks.images import ImageArray
from clbench.data.datasets import ArrayDataset, targets_of
from clbench.errors import UserError
from dataset_layouts import CIFAR_NAMES, write_cifar10
from clbench.data.streams import ordered_experiences

TRAIN_PER_CLASS, TEST_PER_CLASS = 60, 12


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return write_cifar10(tmp_path_factory.mktemp("cifar"), train_per_class=TRAIN_PER_CLASS,
                         test_per_class=TEST_PER_CLASS)


def build(base, **kw):
    kw.setdefault("min_size", 20)
    return cifar10_dirichlet(str(base), **kw)


def test_batches_are_read_channel_major(base):
    x_tr, y_tr, x_te, y_te, names = load(str(base))
    assert x_tr.shape == (10 * TRAIN_PER_CLASS, 3, 32, 32) and x_te.shape == (10 * TEST_PER_CLASS, 3, 32, 32)
    assert names == list(CIFAR_NAMES)
    with open(base / "data_batch_2", "rb") as f:
        raw = pickle.load(f, encoding="bytes")
    offset = len(pickle.load(open(base / "data_batch_1", "rb"), encoding="bytes")[b"labels"])
    i, c, h, w = 7, 2, 5, 30
    assert x_tr[offset + i, c, h, w] == raw[b"data"][i, c * 1024 + h * 32 + w]
    assert y_tr[offset + i] == raw[b"labels"][i]
    assert np.bincount(y_te).tolist() == [TEST_PER_CLASS] * 10


def test_partitions_use_every_sample_once(base):
    scenario = build(base, num_experiences=5, alpha=0.3)
    split = scenario.dirichlet
    n_train, n_test = 10 * TRAIN_PER_CLASS, 10 * TEST_PER_CLASS
    train = np.concatenate(split.train_indices)
    test = np.concatenate(split.test_indices)
    assert len(train) == len(set(train.tolist())) == n_train
    assert len(test) == len(set(test.tolist())) == n_test
    exps = ordered_experiences(scenario, "default")
    assert [e.name for e in exps] == [f"part{p}" for p in range(5)]
    assert sum(len(e.train) for e in exps) == n_train and sum(len(e.test) for e in exps) == n_test
    assert all(len(e.train) >= 20 for e in exps)
    _, y_tr, _, y_te, _ = load(str(base))
    for exp, idx, tidx in zip(exps, split.train_indices, split.test_indices):
        assert targets_of(exp.train).tolist() == y_tr[idx].tolist()
        assert targets_of(exp.test).tolist() == y_te[tidx].tolist()
        assert exp.classes == sorted(set(y_tr[idx].tolist()))


def test_class_proportions_reproduce_for_a_seed_and_change_with_it(base):
    a = build(base, partition_seed=5).dirichlet
    b = build(base, partition_seed=5).dirichlet
    c = build(base, partition_seed=6).dirichlet
    assert np.array_equal(a.proportions, b.proportions)
    assert all(np.array_equal(x, y) for x, y in zip(a.train_indices, b.train_indices))
    assert not np.allclose(a.proportions, c.proportions)
    # each class's samples are all placed: its shares over the partitions sum to one
    assert np.allclose(a.proportions.sum(axis=0), 1.0)


def test_partitions_are_class_imbalanced(base):
    _, y_tr, _, _, _ = load(str(base))
    split = build(base, alpha=0.3, partition_seed=1).dirichlet
    mixes = np.array([np.bincount(y_tr[idx], minlength=10) / len(idx) for idx in split.train_indices])
    assert mixes.max() > 0.25  # a uniform mix would put 0.1 of every partition on each class


def test_balanced_global_test_set(base):
    spec = build(base).clbench
    assert isinstance(spec.global_test, ArrayDataset)
    assert np.bincount(spec.global_test.y.numpy(), minlength=10).tolist() == [TEST_PER_CLASS] * 10
    assert spec.num_classes == 10 and spec.class_names == list(CIFAR_NAMES)
    assert spec.scenario_type == "instance-il" and spec.input_shape == (3, 32, 32)


def test_training_images_are_augmented_per_sample_and_test_batches_are_not(base):
    exp = ordered_experiences(build(base, image_size=16), "default")[0]
    assert isinstance(exp.train, ImageArray) and isinstance(exp.test, ArrayDataset)
    x1, x2 = exp.train[0][0], exp.train[0][0]
    assert x1.shape == (3, 16, 16) and not torch.equal(x1, x2)
    batch, y = exp.test[[0, 1, 2]]
    assert batch.shape == (3, 3, 16, 16) and batch.dtype == torch.float32
    assert torch.equal(batch[1], exp.test[1][0])
    plain = ordered_experiences(build(base, augment=False, normalize="none"), "default")[0]
    assert isinstance(plain.train, ArrayDataset)
    x, _ = plain.train[[0]]
    x_tr, *_ = load(str(base))
    idx = build(base, augment=False).dirichlet.train_indices[0][0]
    assert torch.allclose(x[0] * 255, torch.from_numpy(x_tr[idx]).float())


def test_thesis_min_size_on_a_small_copy_says_what_to_change(base):
    with pytest.raises(UserError) as err:
        cifar10_dirichlet(str(base))  # min_size=1400 cannot fit 600 images into 5 partitions
    assert "min_size" in str(err.value) and "\n" not in str(err.value)


def test_missing_root_and_missing_batch_are_named(base, tmp_path):
    with pytest.raises(UserError) as err:
        build(tmp_path / "none")
    assert str(tmp_path / "none") in str(err.value)
    dst = tmp_path / "cifar-10-batches-py"
    shutil.copytree(base, dst)
    (dst / "data_batch_3").unlink()
    with pytest.raises(UserError) as err:
        build(tmp_path)  # the parent folder works as root too
    assert str(dst / "data_batch_3") in str(err.value) and "\n" not in str(err.value)


def test_corrupt_or_foreign_batches_are_named(base, tmp_path):
    dst = tmp_path / "cifar-10-batches-py"
    shutil.copytree(base, dst)
    (dst / "test_batch").write_bytes(b"\x80\x04garbage")
    with pytest.raises(UserError) as err:
        build(dst)
    assert str(dst / "test_batch") in str(err.value)
    with open(dst / "test_batch", "wb") as f:
        pickle.dump({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 1]}, f)  # str keys: not the python batches
    with pytest.raises(UserError, match="b'data'"):
        build(dst)
    with open(dst / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((2, 1024), np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(UserError, match="3072"):
        build(dst)


class _Payload:
    """What a malicious pickle holds: unpickling it runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import shlex

        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


@pytest.mark.parametrize("name", ["batches.meta", "data_batch_2"])
def test_a_pickle_payload_in_a_batch_does_not_run(base, tmp_path, name):
    dst = tmp_path / "cifar-10-batches-py"
    shutil.copytree(base, dst)
    marker = tmp_path / "ran"
    with open(dst / name, "wb") as f:
        pickle.dump({b"label_names": _Payload(marker), b"data": _Payload(marker)}, f, protocol=2)
    with pytest.raises(UserError) as err:
        build(dst)
    assert not marker.exists()
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{dst / name}: refused to unpickle: the file names {os.system.__module__}.system")


def _rewrite(base: Path, tmp_path: Path, name: str, change) -> Path:
    """A copy of the batches whose file ``name`` is re-pickled after ``change(batch dict)``."""
    dst = tmp_path / "cifar-10-batches-py"
    shutil.copytree(base, dst)
    with open(dst / name, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    change(batch)
    with open(dst / name, "wb") as f:
        pickle.dump(batch, f)
    return dst


@pytest.mark.parametrize("label, says", [("3", "'3' (str)"), (b"3", "b'3' (bytes)"), (None, "None (NoneType)"),
                                         (9.9, "9.9 (float)"), (True, "True (bool)"), (np.float64(2), "(float64)"),
                                         (2**70, "1180591620717411303424, outside 0..9"), (-1, "-1, outside 0..9"),
                                         (10, "10, outside 0..9")])
def test_a_label_that_is_not_an_int_in_0_to_9_is_named(base, tmp_path, label, says):
    dst = _rewrite(base, tmp_path, "data_batch_4", lambda b: b[b"labels"].__setitem__(5, label))
    with pytest.raises(UserError) as err:
        load(str(dst))
    text = str(err.value)
    assert text.startswith(f"{dst / 'data_batch_4'}: label 5 is ") and says in text and "\n" not in text


@pytest.mark.parametrize("field, value, says", [
    (b"labels", np.zeros(20, np.float32), "b'labels' is a ndarray of shape (20,) and dtype float32"),
    (b"labels", {0: 1}, "b'labels' is a dict"),
    (b"data", [[0] * 3072] * 2, "b'data' is a list, expected an (N, 3072) uint8 array"),
    (b"data", np.zeros((2, 3072), np.int64), "b'data' is a ndarray of shape (2, 3072) and dtype int64"),
])
def test_batch_contents_of_the_wrong_type_are_named(base, tmp_path, field, value, says):
    dst = _rewrite(base, tmp_path, "test_batch", lambda b: b.__setitem__(field, value))
    with pytest.raises(UserError) as err:
        load(str(dst))
    assert str(err.value).startswith(f"{dst / 'test_batch'}: {says}")


def test_labels_and_images_must_match_in_number(base, tmp_path):
    dst = _rewrite(base, tmp_path, "test_batch", lambda b: b[b"labels"].pop())
    with pytest.raises(UserError, match="images but b'labels'"):
        load(str(dst))


def test_class_names_must_be_ten_utf8_names(base, tmp_path):
    dst = _rewrite(base, tmp_path, "batches.meta", lambda m: m[b"label_names"].__setitem__(0, b"\xff\xfe"))
    with pytest.raises(UserError, match="a class name is not UTF-8"):
        load(str(dst))


def test_the_official_python2_pickles_read_the_same(base, tmp_path):
    """The real batches are Python 2 cPickle files (memo from 1, NumPy 1.x's dtype flags)."""
    py2 = write_cifar10(tmp_path, train_per_class=TRAIN_PER_CLASS, test_per_class=TEST_PER_CLASS, python2=True)
    assert (py2 / "data_batch_1").read_bytes()[:4] == b"\x80\x02}q"
    for a, b in zip(load(str(py2)), load(str(base))):
        assert (a == b if isinstance(a, list) else np.array_equal(a, b))
