"""CORe50 (Lomonaco & Maltoni, 2017) read from its published on-disk layout.

50 domestic objects in 10 categories of 5 (object ``oN`` is category ``(N - 1) // 5``), filmed
in 11 sessions (``s1``..``s11``) with different backgrounds and lighting. The 128x128 release is
``core50_128x128/s{S}/o{O}/C_{SS}_{OO}_{FFF}.png``; the same images also ship as one array,
``core50_imgs.npz`` (key ``x``, shape (164866, 128, 128, 3), uint8), with ``paths.pkl`` listing
each row's relative path (``s11/o1/C_11_01_000.png``) in the same order.

``root`` is the folder that holds ``core50_128x128/`` (and, if downloaded, ``core50_imgs.npz``
and ``paths.pkl``), or the ``core50_128x128`` folder itself.

Protocols:

* ``ni`` (the standard New Instances protocol): the 8 training sessions 1, 2, 4, 5, 6, 8, 9, 11
  are the experiences, in that order; every experience is tested on the union of sessions 3, 7
  and 10. The test set is the same object in every column of R, because the protocol has one
  test set.
* ``domains11`` (the thesis, seeds_004 section 3.2): all 11 sessions are domains, each split
  into train/test by a seeded split stratified by object, so every object is in both splits of
  every session. The thesis does not say how it split sessions; consecutive frames of one
  object are nearly identical (they come from a 15-20 fps video), so a random frame split
  measures within-session generalisation, not robustness to new footage.

Labels are object-level (50 classes) or category-level (10). When ``objects`` restricts the
stream to some objects, labels are renumbered 0..k-1 over the classes in use, so the model
head and the per-class metrics only cover classes that exist.

Orders: ``default`` is numeric session order; ``ni-train-then-test`` (domains11) runs the NI
training sessions first and the NI test sessions last; any stream also takes
``{permutation: SEED}`` and explicit lists of session names.
"""

from __future__ import annotations

import os
import re
import reprlib
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import AfterValidator, Field

from clbench.benchmarks.image_transforms import Augment, AugmentOverrides, image_transform, resolve_augment
from clbench.benchmarks.images import (ImageArray, ImageFiles, ImageSize, Normalization, NpzArray, TestFraction,
                                       dataset_root, derived_seed, stratified_split)
from clbench.errors import UserError
from clbench.data.streams import StreamSpec, build_scenario
from clbench.data import safe_pickle
from clbench.config.validation import ArgumentError, distinct

SESSIONS = tuple(range(1, 12))
NI_TRAIN_SESSIONS = (1, 2, 4, 5, 6, 8, 9, 11)
NI_TEST_SESSIONS = (3, 7, 10)
NUM_OBJECTS = 50
OBJECTS_PER_CATEGORY = 5
NATIVE_SIZE = 128
# In the order the dataset's page lists them; objects o1-o5 form the first category, and so on.
CATEGORY_NAMES = ("plug_adapter", "mobile_phone", "scissors", "light_bulb", "can", "glasses", "ball", "marker",
                  "cup", "remote_control")
FOLDER = "core50_128x128"
NPZ_FILE = "core50_imgs.npz"
PATHS_FILE = "paths.pkl"
NPZ_IMAGES = 164866  # the rows of the official core50_imgs.npz, each 128x128x3
MAX_PATHS_BYTES = 64 << 20  # paths.pkl lists 164,866 short relative paths (a few MB)
PATHS_FIX = "re-download paths.pkl from the CORe50 page"
NPZ_FIX = "re-download core50_imgs.npz from the CORe50 page"
FILE_RE = re.compile(r"C_(\d{2})_(\d{2})_(\d{3})\.png")
PATH_RE = re.compile(r"s(\d+)/o(\d+)/C_(\d{2})_(\d{2})_(\d{3})\.png")
FIX = "see docs/datasets.md: download core50_128x128.zip from the CORe50 page and extract it whole"
DEFAULT_AUGMENT = Augment()


def _missing(kind: str, paths: list[str], fix: str = FIX) -> UserError:
    """One error naming the first path in full and up to five more by their last two parts."""
    more = f" (and {len(paths) - 1} more: {', '.join('/'.join(Path(p).parts[-2:]) for p in paths[1:6])}" \
           f"{', ...' if len(paths) > 6 else ''})" if len(paths) > 1 else ""
    return UserError(f"{kind}{more}", where=paths[0], fix=fix)


def locate(root: str) -> tuple[Path | None, tuple[Path, Path] | None]:
    """(the ``core50_128x128`` folder or None, (npz, paths.pkl) or None) under ``root``."""
    base = dataset_root(root, "CORe50", "point root at the folder holding core50_128x128/")
    folder = None
    if (base / FOLDER).is_dir():
        folder = base / FOLDER
    elif base.name == FOLDER or any((base / f"s{s}").is_dir() for s in SESSIONS):
        folder = base
    arrays = None
    for place in (base, base.parent) if folder == base else (base,):
        if (place / NPZ_FILE).is_file() and (place / PATHS_FILE).is_file():
            arrays = (place / NPZ_FILE, place / PATHS_FILE)
            break
    if folder is None and arrays is None:
        raise UserError(f"no {FOLDER}/ folder and no {NPZ_FILE} + {PATHS_FILE} here", where=str(base),
                        fix="point root at the folder holding core50_128x128/ (see docs/datasets.md)")
    return folder, arrays


def scan_folder(folder: Path, sessions: list[int], objects: list[int]) -> list[tuple[str, int, int, int]]:
    """(path, session, object, frame) of every image of ``sessions`` x ``objects``, sorted.

    Every missing session folder, missing or empty object folder and misplaced file is
    collected first, so one error names all of them of the first kind found.
    """
    missing_sessions = [str(folder / f"s{s}") for s in sessions if not (folder / f"s{s}").is_dir()]
    if missing_sessions:
        raise _missing("session folder missing", missing_sessions)
    samples: list[tuple[str, int, int, int]] = []
    missing, empty, misplaced = [], [], []
    for s in sessions:
        for o in objects:
            obj_dir = folder / f"s{s}" / f"o{o}"
            if not obj_dir.is_dir():
                missing.append(str(obj_dir))
                continue
            found = 0
            with os.scandir(obj_dir) as entries:
                for entry in entries:
                    match = FILE_RE.fullmatch(entry.name)
                    if not match:
                        continue
                    if (int(match[1]), int(match[2])) != (s, o):
                        misplaced.append(entry.path)
                        continue
                    samples.append((entry.path, s, o, int(match[3])))
                    found += 1
            if not found:
                empty.append(str(obj_dir))
    if missing:
        raise _missing("object folder missing", missing)
    if empty:
        raise _missing("object folder has no C_SS_OO_FFF.png images", empty)
    if misplaced:
        raise _missing("image is in the wrong session/object folder for its name", misplaced,
                       fix="C_SS_OO_FFF.png belongs in sSS/oOO; re-extract core50_128x128.zip")
    samples.sort(key=lambda t: (t[1], t[2], t[3]))
    return samples


def scan_arrays(npz: Path, paths_file: Path, sessions: list[int], objects: list[int]):
    """(NpzArray, rows, session, object) for the rows of ``sessions`` x ``objects`` in the npz form.

    ``paths.pkl`` is read with :mod:`clbench.data.safe_pickle`, and the array's ``.npy`` header
    is checked against the dataset's size and the path list before any image is read."""
    paths = safe_pickle.load(paths_file, fix=PATHS_FIX, max_bytes=MAX_PATHS_BYTES)
    if not isinstance(paths, (list, tuple)) or not all(isinstance(p, str) for p in paths):
        raise UserError("expected a pickled list of relative image paths", where=str(paths_file), fix=PATHS_FIX)
    if len(paths) > NPZ_IMAGES:
        raise UserError(f"lists {len(paths)} images, more than the {NPZ_IMAGES} of CORe50", where=str(paths_file),
                        fix=PATHS_FIX)
    parsed = np.zeros((len(paths), 2), dtype=np.int64)
    for i, p in enumerate(paths):
        match = PATH_RE.fullmatch(p.replace("\\", "/"))
        if not match:
            raise UserError(f"entry {i} {reprlib.repr(p)} is not sS/oO/C_SS_OO_FFF.png", where=str(paths_file),
                            fix=PATHS_FIX)
        parsed[i] = int(match[1]), int(match[2])
    source = NpzArray(npz, "x", max_shape=(NPZ_IMAGES, NATIVE_SIZE, NATIVE_SIZE, 3), fix=NPZ_FIX)
    shape, dtype = source.shape, source.dtype
    if shape[-1] != 3 or dtype != np.uint8:
        raise UserError(f"array 'x' has shape {shape} and dtype {dtype}, expected (N, H, W, 3) uint8",
                        where=str(npz), fix=NPZ_FIX)
    if shape[0] != len(paths):
        raise UserError(f"array 'x' has {shape[0]} images but {paths_file.name} lists {len(paths)}", where=str(npz),
                        fix="download core50_imgs.npz and paths.pkl from the same release")
    _ = source.array  # map it (or read a compressed member) now, so a damaged file is named here
    present = {(int(s), int(o)) for s, o in parsed}
    missing_sessions = [f"{npz}: s{s}" for s in sessions if not any((s, o) in present for o in objects)]
    if missing_sessions:
        raise _missing("session has no images in the npz", missing_sessions,
                       fix="re-download core50_imgs.npz and paths.pkl")
    missing = [f"{npz}: s{s}/o{o}" for s in sessions for o in objects if (s, o) not in present]
    if missing:
        raise _missing("object has no images in the npz", missing, fix="re-download core50_imgs.npz and paths.pkl")
    keep = np.isin(parsed[:, 0], sessions) & np.isin(parsed[:, 1], objects)
    rows = np.flatnonzero(keep)
    return source, rows, parsed[rows, 0], parsed[rows, 1]


# Session and object numbers as the dataset names them (s1..s11, o1..o50), each listed once.
Sessions = Annotated[list[Annotated[int, Field(ge=1, le=11)]], Field(min_length=1), AfterValidator(distinct)]
Objects = Annotated[list[Annotated[int, Field(ge=1, le=50)]], Field(min_length=1), AfterValidator(distinct)]


def core50(root: str, protocol: Literal["domains11", "ni"] = "domains11",
           labels: Literal["object", "category"] = "object", test_fraction: TestFraction = 0.2, split_seed: int = 0,
           sessions: Sessions | None = None, objects: Objects | None = None,
           source: Literal["auto", "png", "npz"] = "auto", image_size: ImageSize = 224,
           augment: bool | AugmentOverrides = True, normalize: Normalization = "imagenet"):
    """CORe50 as a domain-incremental stream, one experience per session.

    ``sessions`` keeps only some of the protocol's experience sessions (``ni``: a subset of its
    8 training sessions; the test sessions stay 3, 7, 10); ``objects`` keeps only some objects
    (default: all 50, every one required in every session). ``source``: ``png`` reads the image
    folders, ``npz`` the ``core50_imgs.npz`` array (memory-mapped, nothing to decode), ``auto``
    the npz when both files are there and the folders otherwise.
    """
    aug = resolve_augment(augment, DEFAULT_AUGMENT)
    allowed = SESSIONS if protocol == "domains11" else NI_TRAIN_SESSIONS
    outside = [s for s in sessions or () if s not in allowed]
    if outside:
        raise ArgumentError("benchmark", "sessions", f"session(s) {outside} are not training sessions of protocol "
                            f"{protocol}", fix=f"choose from {list(allowed)}")
    exp_sessions = sorted(sessions) if sessions is not None else list(allowed)
    if protocol == "ni" and sessions is not None:
        exp_sessions = [s for s in NI_TRAIN_SESSIONS if s in exp_sessions]  # keep the protocol's order
    objs = sorted(objects) if objects is not None else list(range(1, NUM_OBJECTS + 1))
    needed = sorted(set(exp_sessions) | (set(NI_TEST_SESSIONS) if protocol == "ni" else set()))

    folder, arrays = locate(root)
    use_npz = source == "npz" or (source == "auto" and arrays is not None)
    if source == "npz" and arrays is None:
        raise UserError(f"no {NPZ_FILE} + {PATHS_FILE} next to the image folder", where=str(Path(root).expanduser()),
                        fix="download both files from the CORe50 page, or set source: png")
    if source == "png" and folder is None:
        raise UserError(f"no {FOLDER}/ folder", where=str(Path(root).expanduser()),
                        fix="extract core50_128x128.zip here, or set source: npz")

    if use_npz:
        array, rows, sess, obj = scan_arrays(arrays[0], arrays[1], needed, objs)
    else:
        samples = scan_folder(folder, needed, objs)
        paths = [p for p, *_ in samples]
        sess = np.array([s for _, s, _, _ in samples], dtype=np.int64)
        obj = np.array([o for _, _, o, _ in samples], dtype=np.int64)

    def make(idx: np.ndarray, targets: np.ndarray, transform):
        """The dataset of samples ``idx`` (positions in the scan) in the form being read."""
        if use_npz:
            return ImageArray(array, rows[idx], targets, transform, channels_last=True)
        return ImageFiles([paths[i] for i in idx], targets, transform)

    raw = obj - 1 if labels == "object" else (obj - 1) // OBJECTS_PER_CATEGORY
    classes_used = sorted(set(raw.tolist()))
    relabel = np.full(max(classes_used) + 1, -1, dtype=np.int64)
    relabel[classes_used] = np.arange(len(classes_used))
    y = relabel[raw]
    names_all = [f"o{o}" for o in range(1, NUM_OBJECTS + 1)] if labels == "object" else list(CATEGORY_NAMES)

    train_tf = image_transform(image_size, aug, normalize, jitter_first=image_size > NATIVE_SIZE)
    eval_tf = image_transform(image_size, None, normalize)
    train, test, names = [], [], []
    if protocol == "ni":
        test_idx = np.flatnonzero(np.isin(sess, NI_TEST_SESSIONS))
        shared_test = make(test_idx, y[test_idx], eval_tf)
        for s in exp_sessions:
            idx = np.flatnonzero(sess == s)
            train.append(make(idx, y[idx], train_tf))
            test.append(shared_test)
            names.append(f"s{s}")
    else:
        for s in exp_sessions:
            idx = np.flatnonzero(sess == s)
            where = str(folder / f"s{s}") if not use_npz else f"{arrays[0]}: s{s}"
            tr, te = stratified_split(obj[idx], test_fraction, derived_seed(split_seed, s), where=where)
            train.append(make(idx[tr], y[idx[tr]], train_tf))
            test.append(make(idx[te], y[idx[te]], eval_tf))
            names.append(f"s{s}")

    named_orders = {}
    if protocol == "domains11":
        named_orders["ni-train-then-test"] = [f"s{s}" for s in NI_TRAIN_SESSIONS + NI_TEST_SESSIONS
                                              if s in exp_sessions]
    spec = StreamSpec(name=f"core50-{protocol}", num_classes=len(classes_used), input_shape=(3, image_size, image_size),
                      scenario_type="domain-il", named_orders=named_orders,
                      class_names=[names_all[c] for c in classes_used], imbalance_metrics=True)
    return build_scenario(spec, train, test, names=names, domain_ids=[s - 1 for s in exp_sessions],
                          classes=[list(range(len(classes_used)))] * len(names))


core50.objective = "classification"  # the stream's objective, known before it is built (preflight)
