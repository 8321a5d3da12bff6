"""Office-Home read from a miniature copy of its official layout."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from clbench.benchmarks.images import ImageArray, ImageFiles, open_rgb
from clbench.benchmarks.office_home import CLASSES, DOMAINS, FOLDER, office_home
from clbench.errors import UserError
from dataset_layouts import write_office_home
from clbench.data.streams import ordered_experiences
from helpers import checked

PER_CLASS = 5


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return write_office_home(tmp_path_factory.mktemp("oh"), per_class=PER_CLASS)


def files_of(base: Path, domain: str) -> set[str]:
    return {str(p) for p in (base / domain).rglob("*.jpg")}


def test_class_list_is_the_official_65_in_image_folder_order():
    assert len(CLASSES) == len(set(CLASSES)) == 65
    assert list(CLASSES) == sorted(CLASSES)
    assert {"Alarm_Clock", "Backpack", "Batteries", "TV", "ToothBrush", "Webcam"} <= set(CLASSES)


def test_four_domains_in_the_thesis_order_with_65_classes_and_disjoint_splits(base):
    scenario = office_home(str(base), image_size=8)
    spec = scenario.clbench
    assert spec.num_classes == 65 and spec.class_names == list(CLASSES)
    assert spec.input_shape == (3, 8, 8)
    exps = ordered_experiences(scenario, "default")
    assert [e.name for e in exps] == ["art", "clipart", "product", "real_world"]
    assert [e.domain_id for e in exps] == [0, 1, 2, 3]
    used: list[str] = []
    for exp, folder in zip(exps, DOMAINS.values()):
        assert isinstance(exp.train, ImageFiles)
        train, test = set(exp.train.paths.tolist()), set(exp.test.paths.tolist())
        assert not train & test
        assert train | test == files_of(base, folder)
        assert len(test) == 65 and len(train) == 65 * (PER_CLASS - 1)
        assert np.bincount(exp.test.targets, minlength=65).tolist() == [1] * 65
        assert exp.classes == list(range(65))
        used += list(train | test)
    assert len(used) == len(set(used)) == 4 * 65 * PER_CLASS


def test_labels_follow_the_class_folder(base):
    exp = ordered_experiences(office_home(str(base), image_size=8), "default")[2]
    for path, y in zip(exp.train.paths.tolist(), exp.train.targets.tolist()):
        assert Path(path).parent.name == CLASSES[y]


def test_root_may_be_the_dataset_folder_or_its_parent(base):
    a = ordered_experiences(office_home(str(base), image_size=8), "default")
    b = ordered_experiences(office_home(str(base.parent), image_size=8), "default")
    assert [e.test.paths.tolist() for e in a] == [e.test.paths.tolist() for e in b]


def test_subsets_renumber_labels(base):
    scenario = office_home(str(base), domains=["real_world", "art"], classes=["Webcam", "Backpack", "TV"],
                           image_size=8)
    assert scenario.clbench.num_classes == 3 and scenario.clbench.class_names == ["Backpack", "TV", "Webcam"]
    exps = ordered_experiences(scenario, "default")
    assert [e.name for e in exps] == ["art", "real_world"] and [e.domain_id for e in exps] == [0, 3]
    for path, y in zip(exps[1].train.paths.tolist(), exps[1].train.targets.tolist()):
        assert Path(path).parent.name == ["Backpack", "TV", "Webcam"][y]
    with pytest.raises(UserError, match=r"init_args\.domains\[0\]: expected one of .*got str 'clip_art'; "
                                        "did you mean 'clipart'"):
        checked(office_home, root=str(base), domains=["clip_art"])


def test_split_seed_reproduces_and_changes_the_split(base):
    def tests(seed):
        return [e.test.paths.tolist() for e in ordered_experiences(office_home(str(base), split_seed=seed), "default")]
    assert tests(3) == tests(3)
    assert tests(3) != tests(4)


def test_images_are_decoded_resized_and_normalized(base):
    exp = ordered_experiences(office_home(str(base), image_size=24, augment=False, normalize="none"), "default")[0]
    x, y = exp.test[0]
    assert x.shape == (3, 24, 24) and x.dtype == torch.float32 and 0.0 <= x.min() and x.max() <= 1.0
    image = np.asarray(Image.open(exp.test.paths[0]).convert("RGB").resize((24, 24), Image.BILINEAR), np.float32)
    assert np.abs(x.permute(1, 2, 0).numpy() * 255 - image).mean() < 12  # same picture, up to the resampler


def test_large_jpeg_is_decoded_at_reduced_scale(tmp_path):
    path = tmp_path / "big.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (800, 1200, 3), dtype=np.uint8)).save(path)
    small = open_rgb(str(path), draft_size=120)
    assert small.size == (300, 200)  # 1/4 scale: 1/8 would make the short side 100 < 120
    assert open_rgb(str(path)).size == (1200, 800)


def copy(base: Path, tmp_path: Path) -> Path:
    dst = tmp_path / FOLDER
    shutil.copytree(base, dst)
    return dst


def one_line(err: pytest.ExceptionInfo) -> str:
    assert "\n" not in str(err.value)
    return str(err.value)


def test_missing_root_is_named(tmp_path):
    with pytest.raises(UserError) as err:
        office_home(str(tmp_path / "nope"))
    assert str(tmp_path / "nope") in one_line(err)


def test_missing_domain_folder_is_named(base, tmp_path):
    dst = copy(base, tmp_path)
    shutil.rmtree(dst / "Real World")
    with pytest.raises(UserError) as err:
        office_home(str(dst))
    assert str(dst / "Real World") in one_line(err) and "domain folder missing" in str(err.value)
    assert len(ordered_experiences(office_home(str(dst), domains=["art", "product"]), "default")) == 2


def test_missing_and_empty_class_folders_are_named(base, tmp_path):
    dst = copy(base, tmp_path)
    empty = dst / "Clipart" / "Mug"
    for f in empty.iterdir():
        f.unlink()
    (empty / ".DS_Store").write_bytes(b"\0")  # hidden and non-image files do not count
    with pytest.raises(UserError) as err:
        office_home(str(dst))
    assert str(empty) in one_line(err) and "no images" in str(err.value)
    shutil.rmtree(empty)
    shutil.rmtree(dst / "Art" / "Kettle")
    with pytest.raises(UserError) as err:
        office_home(str(dst))
    text = one_line(err)
    assert str(dst / "Art" / "Kettle") in text and "Mug" in text and "class folder missing" in text


def test_too_few_images_for_a_stratified_split_is_named(tmp_path):
    base = write_office_home(tmp_path, domains=["Art"], classes=["Bed", "Pen"], per_class=1)
    with pytest.raises(UserError) as err:
        office_home(str(base), domains=["art"], classes=["Bed", "Pen"])
    assert str(base / "Art") in one_line(err) and "test_fraction" in str(err.value)


def test_corrupt_image_is_named_when_read(base, tmp_path):
    dst = copy(base, tmp_path)
    bad = dst / "Product" / "Fan" / "00002.jpg"
    bad.write_bytes(bad.read_bytes()[:40])
    exps = ordered_experiences(office_home(str(dst), image_size=8), "default")
    dataset = exps[2].train if str(bad) in exps[2].train.paths.tolist() else exps[2].test
    index = dataset.paths.tolist().index(str(bad))
    with pytest.raises(UserError) as err:
        dataset[index]
    assert str(bad) in one_line(err) and "cannot decode" in str(err.value)


def test_preload_gives_the_same_stream_from_memory(base):
    files = ordered_experiences(office_home(str(base), image_size=16, augment=False), "default")
    memory = ordered_experiences(office_home(str(base), image_size=16, augment=False, preload=True), "default")
    for a, b in zip(files, memory):
        assert isinstance(b.train, ImageArray) and isinstance(b.test, ImageArray)
        assert a.train.targets.tolist() == b.train.targets.tolist()
        assert a.test.targets.tolist() == b.test.targets.tolist()
    for i in (0, 30, 64):
        x_file, x_mem = files[3].test[i][0], memory[3].test[i][0]
        assert x_file.shape == x_mem.shape == (3, 16, 16)
        assert (x_file - x_mem).abs().mean() < 0.05  # the same picture, resampled by PIL instead of torchvision


def test_preload_names_a_corrupt_image(base, tmp_path):
    dst = copy(base, tmp_path)
    bad = dst / "Art" / "Pen" / "00004.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 broken")
    with pytest.raises(UserError) as err:
        office_home(str(dst), image_size=8, preload=True)
    assert str(bad) in one_line(err)
