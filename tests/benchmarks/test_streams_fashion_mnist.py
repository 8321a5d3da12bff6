"""Fashion-MNIST: the IDX reader on miniature trees (gzipped and raw), its one-line errors, and
the Split / Rotated / Permuted / Dirichlet streams built on it."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from clbench.benchmarks import fashion_mnist as fm
from clbench.benchmarks.fashion_mnist_streams import (fashion_mnist_dirichlet, fashion_mnist_permuted,
                                                      fashion_mnist_rotated, fashion_mnist_split)
from clbench.data.datasets import ArrayDataset, targets_of
from dataset_layouts import write_fashion_mnist
from clbench.data.streams import ordered_experiences, spec_of
from clbench.errors import UserError

TRAIN, TEST = 6, 3  # images per class in the miniature trees
REAL = Path(fm.DEBIAN_ROOT)


@pytest.fixture(scope="module")
def gz_root(tmp_path_factory) -> Path:
    return write_fashion_mnist(tmp_path_factory.mktemp("fm-gz"), train_per_class=TRAIN, test_per_class=TEST)


@pytest.fixture(scope="module")
def raw_root(tmp_path_factory) -> Path:
    return write_fashion_mnist(tmp_path_factory.mktemp("fm-raw"), train_per_class=TRAIN, test_per_class=TEST,
                               gz=False)


def copy(root: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(root, dst)
    return dst


def one_line(call) -> str:
    with pytest.raises(UserError) as err:
        call()
    assert "\n" not in str(err.value)
    return str(err.value)


# -- the reader -------------------------------------------------------------------------------

def test_gzipped_and_raw_trees_read_the_same_pixels_and_labels(gz_root, raw_root):
    a, b = fm.load(str(gz_root), "header"), fm.load(str(raw_root), "header")
    assert a.x_train.shape == (10 * TRAIN, 28, 28) and a.x_test.shape == (10 * TEST, 28, 28)
    assert a.x_train.dtype == np.uint8 and a.y_train.dtype == np.int64
    assert np.bincount(a.y_train).tolist() == [TRAIN] * 10
    # the same generator wrote both trees, so their arrays are equal; and they are what the bytes say
    assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_test, b.y_test)
    raw = (raw_root / "train-images-idx3-ubyte").read_bytes()
    assert a.x_train[3, 7, 11] == raw[16 + 3 * 784 + 7 * 28 + 11]
    assert a.y_train[5] == (raw_root / "train-labels-idx1-ubyte").read_bytes()[8 + 5]


def test_a_folder_may_mix_gzipped_and_raw_files(raw_root, tmp_path):
    root = copy(raw_root, tmp_path)
    name = root / "t10k-images-idx3-ubyte"
    (root / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(name.read_bytes()))
    name.unlink()
    assert np.array_equal(fm.load(str(root), "header").x_test, fm.load(str(raw_root), "header").x_test)


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "raw"])
def test_a_missing_file_is_named(gz, gz_root, raw_root, tmp_path):
    root = copy(gz_root if gz else raw_root, tmp_path)
    for path in root.glob("train-labels-idx1-ubyte*"):
        path.unlink()
    text = one_line(lambda: fm.load(str(root), "header"))
    assert str(root / "train-labels-idx1-ubyte.gz") in text and "missing" in text
    assert "dataset-fashion-mnist" in text and fm.SOURCE in text


def test_a_truncated_raw_file_is_named(raw_root, tmp_path):
    root = copy(raw_root, tmp_path)
    path = root / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    text = one_line(lambda: fm.load(str(root), "header"))
    assert str(path) in text and "truncated IDX file" in text


def test_a_truncated_gzip_file_is_named(gz_root, tmp_path):
    root = copy(gz_root, tmp_path)
    path = root / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-50])
    text = one_line(lambda: fm.load(str(root), "header"))
    assert str(path) in text and "truncated gzip" in text


def test_a_file_of_the_wrong_kind_is_named(raw_root, tmp_path):
    root = copy(raw_root, tmp_path)
    shutil.copy(root / "train-labels-idx1-ubyte", root / "train-images-idx3-ubyte")  # labels where images belong
    text = one_line(lambda: fm.load(str(root), "header"))
    assert str(root / "train-images-idx3-ubyte") in text and "0x00000801" in text


def _idx_header(magic: int, *dims: int) -> bytes:
    return magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims)


def test_a_gzip_that_inflates_past_its_header_is_refused_after_one_byte_more(gz_root, tmp_path, capfd):
    """A decompression bomb: a valid header for 60 images, then 64 MiB of zeros (64 KB on disk)."""
    import tracemalloc

    from helpers import cli_in_process

    root = copy(gz_root, tmp_path)
    path = root / "train-images-idx3-ubyte.gz"
    with gzip.open(path, "wb") as f:
        f.write(_idx_header(0x0803, 60, 28, 28))
        for _ in range(64):
            f.write(bytes(1 << 20))
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        text = one_line(lambda: fm.read_file(root, "train_images", "header"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert text.startswith(f"{path}: IDX file longer than its header says: more than the 47056 bytes its header "
                           "(60 items) declares (re-download it: ")
    assert peak < 8 << 20, peak  # the 47 KB it declares and a chunk, not the 64 MiB it inflates to
    out = cli_in_process(capfd, "data", "check", "fashion-mnist-split", "--root", str(root), "verify=header")
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [f"clbench: error: {text}"]


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "raw"])
@pytest.mark.parametrize("verify", ["header", "md5"])
def test_a_header_declaring_more_than_the_dataset_is_refused_before_reading_on(gz, verify, tmp_path):
    root = tmp_path / "fm"
    write_fashion_mnist(root, train_per_class=TRAIN, test_per_class=TEST, gz=gz)
    path = root / f"t10k-labels-idx1-ubyte{'.gz' if gz else ''}"
    data = _idx_header(0x0801, 2**32 - 1) + bytes(100)
    path.write_bytes(gzip.compress(data) if gz else data)
    text = one_line(lambda: fm.read_file(root, "test_labels", verify))
    says = ("4294967295 items, the official file has 10000" if verify == "md5" else
            "IDX header declares 4294967295 items, more than the official file's 10000")
    assert text.startswith(f"{path}: {says}")


def test_the_official_check_refuses_other_files(gz_root):
    text = one_line(lambda: fm.load(str(gz_root)))  # verify: md5, the default
    assert str(gz_root / "train-images-idx3-ubyte.gz") in text and "the official file has 60000" in text


def test_the_official_check_compares_the_contents_md5(gz_root, monkeypatch):
    # the miniature file passes the checks when it is declared official, up to its MD5
    spec = fm.FILES["train_images"]
    monkeypatch.setitem(fm.FILES, "train_images", fm.IdxFile(spec.name, spec.magic, 10 * TRAIN, spec.md5,
                                                             spec.gz_md5))
    text = one_line(lambda: fm.read_file(gz_root, "train_images"))
    assert "MD5" in text and spec.md5 in text


def test_no_root_looks_in_the_debian_folder_then_the_cache(gz_root, tmp_path, monkeypatch):
    monkeypatch.setattr(fm, "DEBIAN_ROOT", str(tmp_path / "absent"))
    monkeypatch.setenv("CLBENCH_CACHE_DIR", str(tmp_path / "cache"))
    text = one_line(lambda: fm.locate(None))
    assert str(tmp_path / "absent") in text and str(tmp_path / "cache" / "fashion-mnist") in text
    shutil.copytree(gz_root, tmp_path / "cache" / "fashion-mnist")
    assert fm.locate(None) == tmp_path / "cache" / "fashion-mnist"


def test_data_check_reports_a_truncated_file_in_one_line_with_status_2(raw_root, tmp_path, capfd):
    from helpers import cli_in_process

    root = copy(raw_root, tmp_path)
    path = root / "t10k-labels-idx1-ubyte"
    path.write_bytes(path.read_bytes()[:12])
    out = cli_in_process(capfd, "data", "check", "fashion-mnist-split", "--root", str(root), "verify=header")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "truncated" in lines[0]
    ok = cli_in_process(capfd, "data", "check", "fashion-mnist-rotated", "--root", str(raw_root), "verify=header")
    assert ok.returncode == 0 and "rot45" in ok.stdout


# -- the streams ------------------------------------------------------------------------------

def test_split_is_five_class_incremental_pairs_held_as_uint8(gz_root):
    scenario = fashion_mnist_split(str(gz_root), verify="header")
    spec = spec_of(scenario)
    assert spec.scenario_type == "class-il" and spec.num_classes == 10 and spec.input_shape == (1, 28, 28)
    exps = ordered_experiences(scenario, "default")
    assert [e.name for e in exps] == ["c0-1", "c2-3", "c4-5", "c6-7", "c8-9"]
    for k, exp in enumerate(exps):
        assert exp.classes == [2 * k, 2 * k + 1]
        assert sorted(set(targets_of(exp.train).tolist())) == exp.classes and len(exp.test) == 2 * TEST
        assert isinstance(exp.train, ArrayDataset) and exp.train.x.dtype == torch.uint8
        x, _ = exp.train[[0, 1]]
        assert x.dtype == torch.float32 and 0 <= float(x.min()) and float(x.max()) <= 1
    assert {int(t) for t in scenario.train_stream[3].dataset.targets_task_labels} == {0}


def test_task_incremental_split_carries_task_labels(gz_root):
    scenario = fashion_mnist_split(str(gz_root), scenario="task-il", verify="header")
    assert spec_of(scenario).scenario_type == "task-il"
    for stream in (scenario.train_stream, scenario.test_stream):
        assert [{int(t) for t in e.dataset.targets_task_labels} for e in stream] == [{0}, {1}, {2}, {3}, {4}]


def test_split_refuses_a_class_in_two_tasks(gz_root):
    assert "more than one task" in one_line(lambda: fashion_mnist_split(str(gz_root), tasks=[[0, 1], [1, 2]],
                                                                        verify="header"))


def test_subsample_is_per_class_and_seeded(gz_root):
    a = ordered_experiences(fashion_mnist_split(str(gz_root), train_per_class=2, test_per_class=1, verify="header"),
                            "default")
    b = ordered_experiences(fashion_mnist_split(str(gz_root), train_per_class=2, test_per_class=1, verify="header",
                                                subsample_seed=1), "default")
    assert [len(e.train) for e in a] == [4] * 5 and [len(e.test) for e in a] == [2] * 5
    assert any(not torch.equal(x.train.x, y.train.x) for x, y in zip(a, b))


def test_a_validation_run_scores_held_out_training_images_and_never_reads_the_test_set(gz_root, tmp_path):
    """validation_per_class: the "test" sets are training images held out of training (seeded,
    per class), the rest trains, and the official test images appear nowhere (not even once
    their file is made unreadable as images: every test pixel set to 255 changes nothing)."""
    data = fm.load(str(gz_root), "header")
    exps = ordered_experiences(fashion_mnist_split(str(gz_root), validation_per_class=2, verify="header"), "default")
    train = torch.cat([e.train.x for e in exps]).reshape(-1, 784)
    held = torch.cat([e.test.x for e in exps]).reshape(-1, 784)
    assert [len(e.test) for e in exps] == [4] * 5 and [len(e.train) for e in exps] == [2 * (TRAIN - 2)] * 5
    official_train = {bytes(row) for row in data.x_train.reshape(len(data.x_train), -1)}
    official_test = {bytes(row) for row in data.x_test.reshape(len(data.x_test), -1)}
    assert {bytes(row.numpy()) for row in held} <= official_train - official_test
    assert not {bytes(row.numpy()) for row in held} & {bytes(row.numpy()) for row in train}  # no image in both
    again = ordered_experiences(fashion_mnist_rotated(str(gz_root), validation_per_class=2, verify="header"),
                                "default")[0]
    assert torch.equal(torch.sort(again.test.y).values, torch.tensor([c for c in range(10) for _ in range(2)]))
    assert "validation_per_class does not read" in one_line(
        lambda: fashion_mnist_split(str(gz_root), validation_per_class=2, test_per_class=1, verify="header"))


def test_rotated_domains_are_the_same_images_rotated(gz_root):
    exps = ordered_experiences(fashion_mnist_rotated(str(gz_root), angles=[0, 90, 45], verify="header"), "default")
    assert [e.name for e in exps] == ["rot0", "rot90", "rot45"]
    base = exps[0].train.x
    assert torch.equal(exps[1].train.x, torch.rot90(base, 1, dims=(-2, -1)))
    assert not torch.equal(exps[2].train.x, base) and exps[2].train.x.dtype == torch.uint8
    assert all(torch.equal(e.train.y, exps[0].train.y) and e.classes == list(range(10)) for e in exps)
    assert spec_of(fashion_mnist_rotated(str(gz_root), verify="header")).scenario_type == "domain-il"


def test_permuted_domains_shuffle_pixels_with_a_fixed_permutation(gz_root):
    scenario = fashion_mnist_permuted(str(gz_root), num_experiences=3, permutation_seed=4, verify="header")
    exps = ordered_experiences(scenario, "default")
    flat = [e.test.x.reshape(len(e.test), -1) for e in exps]
    original = torch.tensor(np.array(fm.load(str(gz_root), "header").x_test))
    assert torch.equal(flat[0], original.reshape(len(flat[0]), -1))
    perm = torch.from_numpy(scenario.permutations[2])
    assert torch.equal(flat[2], flat[0][:, perm]) and not torch.equal(flat[2], flat[0])
    assert not np.array_equal(scenario.permutations[1], scenario.permutations[2])


def test_dirichlet_partitions_every_training_image_once(gz_root):
    scenario = fashion_mnist_dirichlet(str(gz_root), num_experiences=3, alpha=0.5, min_size=5, verify="header")
    exps = ordered_experiences(scenario, "default")
    assert sum(len(e.train) for e in exps) == 10 * TRAIN
    idx = np.concatenate(scenario.dirichlet.train_indices)
    assert len(set(idx.tolist())) == 10 * TRAIN
    spec = spec_of(scenario)
    assert spec.scenario_type == "instance-il" and spec.global_test is not None and spec.imbalance_metrics


# -- the real files (where the Debian package is installed) -----------------------------------

@pytest.mark.skipif(not REAL.is_dir(), reason=f"the Fashion-MNIST files are not installed at {REAL} "
                                              "(apt-get install dataset-fashion-mnist)")
def test_the_installed_files_are_the_official_release():
    data = fm.load()  # no root: the Debian folder; verify: md5
    assert data.x_train.shape == (60000, 28, 28) and data.x_test.shape == (10000, 28, 28)
    assert np.bincount(data.y_train).tolist() == [6000] * 10 and np.bincount(data.y_test).tolist() == [1000] * 10
