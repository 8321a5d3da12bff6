"""CORe50 read from miniature copies of its official layouts (PNG folders and npz + paths.pkl)."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from clbench.benchmarks.core50 import CATEGORY_NAMES, NI_TEST_SESSIONS, NI_TRAIN_SESSIONS, NUM_OBJECTS, SESSIONS, core50
from clbench.benchmarks.images import ImageArray, ImageFiles, NpzArray
from clbench.errors import UserError
from helpers import checked
from dataset_layouts import write_core50
from clbench.data.streams import ordered_experiences, resolve_order

OBJECTS = [1, 2, 3, 6, 7, 11]  # categories 0, 0, 0, 1, 1, 2
FRAMES = 5


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return write_core50(tmp_path_factory.mktemp("core50"), objects=OBJECTS, frames=FRAMES, npz=True)


def build(root, **kw):
    """The stream, its arguments checked first as a run checks them."""
    kw.setdefault("objects", OBJECTS)
    kw.setdefault("image_size", 8)
    return checked(core50, root=str(root), **kw)


def all_pngs(root: Path, sessions) -> set[str]:
    return {str(p) for s in sessions for p in (root / "core50_128x128" / f"s{s}").rglob("*.png")}


def test_domains11_has_one_experience_per_session_with_disjoint_stratified_splits(root):
    scenario = build(root, source="png")
    spec = scenario.clbench
    exps = ordered_experiences(scenario, "default")
    assert [e.name for e in exps] == [f"s{s}" for s in range(1, 12)]
    assert [e.domain_id for e in exps] == list(range(11))
    assert spec.num_classes == len(OBJECTS) and spec.class_names == [f"o{o}" for o in OBJECTS]
    assert spec.input_shape == (3, 8, 8) and spec.scenario_type == "domain-il"
    used: list[str] = []
    for s, exp in zip(range(1, 12), exps):
        assert isinstance(exp.train, ImageFiles)
        train, test = set(exp.train.paths.tolist()), set(exp.test.paths.tolist())
        assert len(train) == len(OBJECTS) * (FRAMES - 1) and len(test) == len(OBJECTS)
        assert not train & test
        assert train | test == all_pngs(root, [s])
        # stratified by object: every object is in both splits, in the 4:1 ratio
        assert np.bincount(exp.train.targets).tolist() == [FRAMES - 1] * len(OBJECTS)
        assert np.bincount(exp.test.targets).tolist() == [1] * len(OBJECTS)
        assert exp.classes == list(range(len(OBJECTS)))
        used += list(train) + list(test)
    assert len(used) == len(set(used)) == len(all_pngs(root, range(1, 12)))


def test_labels_match_the_object_in_the_file_name(root):
    exps = ordered_experiences(build(root, source="png"), "default")
    for exp in exps[:3]:
        for path, y in zip(exp.train.paths, exp.train.targets):
            obj = int(Path(str(path)).name.split("_")[2])
            assert OBJECTS[y] == obj


def test_category_labels_group_five_objects(root):
    scenario = build(root, source="png", labels="category")
    assert scenario.clbench.num_classes == 3
    assert scenario.clbench.class_names == list(CATEGORY_NAMES[:3])
    exp = ordered_experiences(scenario, "default")[0]
    for path, y in zip(exp.train.paths, exp.train.targets):
        obj = int(Path(str(path)).name.split("_")[2])
        assert y == [0, 0, 0, 1, 1, 2][OBJECTS.index(obj)]


def test_ni_protocol_trains_on_eight_sessions_and_tests_on_3_7_10(root):
    scenario = build(root, protocol="ni", source="png")
    exps = ordered_experiences(scenario, "default")
    assert [e.name for e in exps] == [f"s{s}" for s in NI_TRAIN_SESSIONS]
    assert [e.domain_id for e in exps] == [s - 1 for s in NI_TRAIN_SESSIONS]
    test = exps[0].test
    assert all(e.test is test for e in exps)
    assert set(test.paths.tolist()) == all_pngs(root, NI_TEST_SESSIONS)
    for s, exp in zip(NI_TRAIN_SESSIONS, exps):
        assert set(exp.train.paths.tolist()) == all_pngs(root, [s])
    assert not any(f"/s{s}/" in p for s in NI_TEST_SESSIONS for e in exps for p in e.train.paths.tolist())


def test_ni_session_subset_keeps_protocol_order_and_rejects_test_sessions(root):
    exps = ordered_experiences(build(root, protocol="ni", sessions=[11, 2, 5], source="png"), "default")
    assert [e.name for e in exps] == ["s2", "s5", "s11"]
    with pytest.raises(UserError, match="sessions"):
        build(root, protocol="ni", sessions=[1, 3])


def test_npz_form_gives_the_same_stream_as_the_png_folders(root):
    png = ordered_experiences(build(root, source="png", augment=False), "default")
    npz = ordered_experiences(build(root, source="npz", augment=False), "default")
    auto = ordered_experiences(build(root, augment=False), "default")
    assert isinstance(npz[0].train, ImageArray) and isinstance(auto[0].train, ImageArray)
    for a, b in zip(png, npz):
        assert a.name == b.name
        assert a.train.targets.tolist() == b.train.targets.tolist()
        assert a.test.targets.tolist() == b.test.targets.tolist()
    # PNG is lossless: the same sample decodes to the same tensor either way
    for i in (0, 7, 23):
        assert torch.equal(png[4].train[i][0], npz[4].train[i][0])
        assert torch.equal(png[9].test[i % 6][0], npz[9].test[i % 6][0])


def test_npz_array_is_memory_mapped_and_pickles_without_its_data(root):
    source = NpzArray(root / "core50_imgs.npz", "x")
    assert isinstance(source.array, np.memmap)
    with np.load(root / "core50_imgs.npz") as data:
        assert np.array_equal(np.asarray(source.array), data["x"])
    blob = pickle.dumps(source)
    assert len(blob) < 1000 < source.array.nbytes
    assert np.array_equal(pickle.loads(blob).array[5], source.array[5])


def test_split_seed_reproduces_and_changes_the_split(root):
    a = ordered_experiences(build(root, source="png", split_seed=1), "default")
    b = ordered_experiences(build(root, source="png", split_seed=1), "default")
    c = ordered_experiences(build(root, source="png", split_seed=2), "default")
    assert all(x.test.paths.tolist() == y.test.paths.tolist() for x, y in zip(a, b))
    assert any(x.test.paths.tolist() != y.test.paths.tolist() for x, y in zip(a, c))
    # sessions are split with different seeds, not the same positions in every session
    picks = [tuple(int(Path(p).stem.split("_")[3]) for p in e.test.paths.tolist()) for e in a]
    assert len(set(picks)) > 1


def test_named_orders_and_permutations(root):
    scenario = build(root, source="png")
    names = [f"s{s}" for s in range(1, 12)]
    order = resolve_order(scenario, "ni-train-then-test")
    assert [names[i] for i in order] == [f"s{s}" for s in NI_TRAIN_SESSIONS + NI_TEST_SESSIONS]
    perm = resolve_order(scenario, {"permutation": 3})
    assert perm == resolve_order(scenario, {"permutation": 3}) and sorted(perm) == list(range(11))
    assert perm != resolve_order(scenario, {"permutation": 4})


def test_training_transform_is_random_and_evaluation_is_not(root):
    exp = ordered_experiences(build(root, source="png", image_size=16), "default")[0]
    x1, x2 = exp.train[0][0], exp.train[0][0]
    assert x1.shape == (3, 16, 16) and x1.dtype == torch.float32 and type(x1) is torch.Tensor
    assert not torch.equal(x1, x2)
    assert torch.equal(exp.test[0][0], exp.test[0][0])
    plain = ordered_experiences(build(root, source="png", augment=False), "default")[0]
    assert torch.equal(plain.train[0][0], plain.train[0][0])


def test_augment_mapping_declares_every_augmentation():
    from dataclasses import fields

    from clbench.benchmarks.image_transforms import Augment, AugmentOverrides

    assert list(AugmentOverrides.__annotations__) == [f.name for f in fields(Augment)]
    assert (SESSIONS[-1], NUM_OBJECTS) == (11, 50)  # the bounds Sessions and Objects declare


def test_augment_mapping_is_checked(root):
    with pytest.raises(UserError, match=r"init_args\.augment\.jiter: unknown key 'jiter'"):
        build(root, augment={"jiter": 0.1})
    with pytest.raises(UserError, match=r"init_args\.augment\.crop_scale: crop_scale must be \[low, high\] with "
                                        r"low <= high"):
        build(root, augment={"crop_scale": [0.9, 0.5]})


def test_full_object_set_is_the_default(tmp_path):
    root = write_core50(tmp_path, sessions=list(NI_TRAIN_SESSIONS) + list(NI_TEST_SESSIONS), frames=1)
    objects = core50(str(root), protocol="ni", image_size=8)
    assert objects.clbench.num_classes == 50 and objects.clbench.class_names[-1] == "o50"
    categories = core50(str(root), protocol="ni", labels="category", image_size=8)
    assert categories.clbench.class_names == list(CATEGORY_NAMES)
    exp = ordered_experiences(categories, "default")[0]
    assert np.bincount(exp.train.targets).tolist() == [5] * 10
    shutil.rmtree(root / "core50_128x128" / "s5" / "o17")
    with pytest.raises(UserError) as err:
        core50(str(root), protocol="ni")
    assert str(root / "core50_128x128" / "s5" / "o17") in str(err.value)


def copy_tree(root: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "core50"
    shutil.copytree(root / "core50_128x128", dst / "core50_128x128")
    return dst


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_missing_root_is_named(tmp_path):
    with pytest.raises(UserError) as err:
        build(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in one_line(err) and "does not exist" in str(err.value)


def test_root_without_the_dataset_is_named(tmp_path):
    with pytest.raises(UserError) as err:
        build(tmp_path)
    assert str(tmp_path) in one_line(err) and "core50_128x128" in str(err.value)


def test_missing_session_folder_is_named(root, tmp_path):
    dst = copy_tree(root, tmp_path)
    shutil.rmtree(dst / "core50_128x128" / "s4")
    shutil.rmtree(dst / "core50_128x128" / "s9")
    with pytest.raises(UserError) as err:
        build(dst)
    text = one_line(err)
    assert str(dst / "core50_128x128" / "s4") in text and "s9" in text and "session" in text
    # a protocol that does not need the session does not ask for it
    assert len(ordered_experiences(build(dst, protocol="ni", sessions=[1, 2]), "default")) == 2


def test_root_may_be_the_image_folder_itself(root, tmp_path):
    dst = copy_tree(root, tmp_path)
    exps = ordered_experiences(build(dst / "core50_128x128"), "default")
    assert len(exps) == 11 and isinstance(exps[0].train, ImageFiles)


def test_empty_and_missing_object_folders_are_named(root, tmp_path):
    dst = copy_tree(root, tmp_path)
    empty = dst / "core50_128x128" / "s2" / "o6"
    for f in empty.iterdir():
        f.unlink()
    with pytest.raises(UserError) as err:
        build(dst)
    assert str(empty) in one_line(err) and "no C_SS_OO_FFF.png" in str(err.value)
    empty.rmdir()
    with pytest.raises(UserError) as err:
        build(dst)
    assert str(empty) in one_line(err) and "missing" in str(err.value)


def test_misplaced_file_is_named(root, tmp_path):
    dst = copy_tree(root, tmp_path)
    src = dst / "core50_128x128" / "s1" / "o1" / "C_01_01_000.png"
    wrong = dst / "core50_128x128" / "s2" / "o1" / "C_01_01_000.png"
    shutil.copy(src, wrong)
    with pytest.raises(UserError) as err:
        build(dst)
    assert str(wrong) in one_line(err)


def test_npz_problems_are_named(root, tmp_path):
    dst = tmp_path / "c"
    dst.mkdir()
    shutil.copy(root / "core50_imgs.npz", dst)
    with open(root / "paths.pkl", "rb") as f:
        paths = pickle.load(f)
    with open(dst / "paths.pkl", "wb") as f:
        pickle.dump(paths[:-1], f)
    with pytest.raises(UserError) as err:
        build(dst)
    assert str(dst / "core50_imgs.npz") in one_line(err) and "lists" in str(err.value)
    (dst / "paths.pkl").write_bytes(b"not a pickle")
    with pytest.raises(UserError) as err:
        build(dst)
    assert str(dst / "paths.pkl") in one_line(err)
    with pytest.raises(UserError, match="no core50_imgs.npz"):
        build(copy_tree(root, tmp_path), source="npz")


def test_bad_arguments_are_named(root):
    with pytest.raises(UserError, match="benchmark.init_args.protocol"):
        build(root, protocol="nc")
    with pytest.raises(UserError, match="benchmark.init_args.objects"):
        build(root, objects=[0, 1])
    with pytest.raises(UserError, match="test_fraction"):
        build(root, source="png", test_fraction=1.5)


class _Payload:
    """What a malicious pickle holds: unpickling it runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import shlex

        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def test_a_pickle_payload_in_paths_pkl_does_not_run(root, tmp_path):
    dst = tmp_path / "c"
    dst.mkdir()
    shutil.copy(root / "core50_imgs.npz", dst)
    marker = tmp_path / "ran"
    for payload in (_Payload(marker), [_Payload(marker), "s1/o1/C_01_01_000.png"]):  # alone, or inside the list
        with open(dst / "paths.pkl", "wb") as f:
            pickle.dump(payload, f)
        with pytest.raises(UserError) as err:
            build(dst)
        assert not marker.exists()
        assert one_line(err).startswith(f"{dst / 'paths.pkl'}: refused to unpickle: the file names {os.system.__module__}.system")


def _npy(shape: tuple, descr: str = "|u1", data: bytes = b"") -> bytes:
    """An .npy member: NumPy's own header for ``shape``, then ``data`` (not necessarily that much)."""
    import io

    import numpy.lib.format as npy

    buf = io.BytesIO()
    npy.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue() + data


NPZ_HEADERS = {
    "a shape of 46 GiB": (_npy((1_000_000, 128, 128, 3)), "the header declares shape (1000000, 128, 128, 3), beyond "
                                                          "the dataset's (164866, 128, 128, 3)"),
    "more than the member holds": (_npy((10, 8, 8, 3), data=bytes(99)), "the header declares shape (10, 8, 8, 3) of "
                                   "uint8 (1920 bytes), but the member holds 99 bytes after its 128-byte header"),
    "a header larger than the file": (b"\x93NUMPY\x01\x00" + (9000).to_bytes(2, "little") + b"{'descr'",
                                      "unreadable .npy header (EOF: reading array header, expected 9000 bytes got 8)"),
    "an object array": (_npy((10, 8, 8, 3), descr="|O"), "the array holds Python objects"),
    "format 3.0": (b"\x93NUMPY\x03\x00" + bytes(10), ".npy format version 3.0"),
}


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflated"])
@pytest.mark.parametrize("case", NPZ_HEADERS)
def test_an_npz_header_is_checked_before_any_of_the_array_is_read(root, tmp_path, case, compressed):
    import zipfile

    member, says = NPZ_HEADERS[case]
    dst = tmp_path / "c"
    dst.mkdir()
    shutil.copy(root / "paths.pkl", dst)
    with zipfile.ZipFile(dst / "core50_imgs.npz", "w", zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED) as z:
        z.writestr("x.npy", member)
    with pytest.raises(UserError) as err:
        build(dst)
    text = one_line(err)
    assert text.startswith(f"{dst / 'core50_imgs.npz'}: x.npy: {says}"), text
    assert text.endswith("(re-download core50_imgs.npz from the CORe50 page)")


def test_a_compressed_npz_reads_the_same_as_the_stored_one(root, tmp_path):
    dst = tmp_path / "c"
    dst.mkdir()
    shutil.copy(root / "paths.pkl", dst)
    with np.load(root / "core50_imgs.npz") as data:
        np.savez_compressed(dst / "core50_imgs.npz", x=data["x"])
    source, stored = NpzArray(dst / "core50_imgs.npz", "x"), NpzArray(root / "core50_imgs.npz", "x")
    assert source.member.file_offset is None and stored.member.file_offset is not None
    assert not isinstance(source.array, np.memmap) and np.array_equal(source.array, stored.array)
    a = ordered_experiences(build(dst, source="npz", augment=False), "default")
    b = ordered_experiences(build(root, source="npz", augment=False), "default")
    assert torch.equal(a[3].train[2][0], b[3].train[2][0])


def test_a_long_entry_in_paths_pkl_is_named_briefly(root, tmp_path):
    dst = tmp_path / "c"
    dst.mkdir()
    shutil.copy(root / "core50_imgs.npz", dst)
    (dst / "paths.pkl").write_bytes(pickle.dumps(["s1/o1/" + "x" * 1_000_000]))
    with pytest.raises(UserError) as err:
        build(dst)
    assert one_line(err).startswith(f"{dst / 'paths.pkl'}: entry 0 's1/o1/xxx") and len(str(err.value)) < 300
