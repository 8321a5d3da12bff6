"""Miniature datasets in exactly the official on-disk layouts, for the tests (kept out of the package).

Real CORe50, Office-Home, CIFAR-10 and Fashion-MNIST cannot be downloaded everywhere the
harness runs, so the loaders are tested on look-alikes: the same folder and file names, the
same file formats (PNG, JPEG, python pickles with the real keys, an npz with a ``paths.pkl``
index, IDX files), with a few tiny images per class. Each image is a class-coloured square on a background tinted by its
domain/session, plus a little noise, so a small model can learn the classes and the domains
differ visibly.

    python tests/dataset_layouts.py OUTDIR            # all four layouts under OUTDIR
    python tests/dataset_layouts.py OUTDIR --frames 2 --per-class 3

writes ``OUTDIR/core50/core50_128x128/...`` (+ ``core50_imgs.npz``, ``paths.pkl``),
``OUTDIR/OfficeHomeDataset_10072016/...``, ``OUTDIR/cifar-10-batches-py/...`` and
``OUTDIR/fashion-mnist/*-ubyte.gz`` (read those with ``verify=header``: they are not the official files).
"""

from __future__ import annotations

import argparse
import colorsys
import pickle
import sys
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np


def _colour(k: int, n: int) -> np.ndarray:
    """A distinct saturated RGB colour (0..255) for class ``k`` of ``n``."""
    r, g, b = colorsys.hsv_to_rgb((k / max(n, 1)) % 1.0, 0.9, 0.5 + 0.5 * ((k * 7) % 3) / 2)
    return np.array([r, g, b]) * 255


def _image(rng: np.random.Generator, size: int, fg: np.ndarray, bg: np.ndarray) -> np.ndarray:
    """(size, size, 3) uint8: a ``fg`` square in the middle half of a ``bg`` background, with noise."""
    img = np.empty((size, size, 3))
    img[:] = bg
    lo, hi = size // 4, size - size // 4
    img[lo:hi, lo:hi] = fg
    img += rng.normal(0, 8, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def _domain_tint(d: int, n: int) -> np.ndarray:
    return np.array(colorsys.hsv_to_rgb((d / max(n, 1) + 0.5) % 1.0, 0.3, 0.35 + 0.4 * (d % 2))) * 255


def write_core50(root: str | Path, *, sessions: Iterable[int] = range(1, 12), objects: Iterable[int] = range(1, 51),
                 frames: int = 5, size: int = 8, png: bool = True, npz: bool = False, seed: int = 0) -> Path:
    """``root/core50_128x128/sS/oO/C_SS_OO_FFF.png`` (and/or ``root/core50_imgs.npz`` +
    ``root/paths.pkl``); returns ``root``. Objects are coloured by object, sessions tinted."""
    from PIL import Image

    root = Path(root)
    sessions, objects = list(sessions), list(objects)
    rng = np.random.default_rng(seed)
    arrays, rel_paths = [], []
    for s in sessions:
        for o in objects:
            folder = root / "core50_128x128" / f"s{s}" / f"o{o}"
            if png:
                folder.mkdir(parents=True, exist_ok=True)
            for f in range(frames):
                img = _image(rng, size, _colour(o - 1, 50), _domain_tint(s - 1, 11))
                name = f"C_{s:02d}_{o:02d}_{f:03d}.png"
                if png:
                    Image.fromarray(img).save(folder / name)
                if npz:
                    arrays.append(img)
                    rel_paths.append(f"s{s}/o{o}/{name}")
    if npz:
        root.mkdir(parents=True, exist_ok=True)
        np.savez(root / "core50_imgs.npz", x=np.stack(arrays))
        with open(root / "paths.pkl", "wb") as f:
            pickle.dump(rel_paths, f)
    return root


def write_office_home(root: str | Path, *, domains: Sequence[str] | None = None, classes: Sequence[str] | None = None,
                      per_class: int = 5, size: int = 8, seed: int = 0) -> Path:
    """``root/OfficeHomeDataset_10072016/<Domain>/<Class>/NNNNN.jpg``; returns the dataset folder."""
    from PIL import Image

    from clbench.benchmarks.office_home import CLASSES, DOMAINS, FOLDER

    domains = list(domains) if domains is not None else list(DOMAINS.values())
    classes = list(classes) if classes is not None else list(CLASSES)
    base = Path(root) / FOLDER
    rng = np.random.default_rng(seed)
    for d, domain in enumerate(domains):
        for k, name in enumerate(classes):
            folder = base / domain / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                img = _image(rng, size, _colour(k, len(classes)), _domain_tint(d, 4))
                Image.fromarray(img).save(folder / f"{i + 1:05d}.jpg", quality=95)
    return base


CIFAR_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def python2_pickle(obj) -> bytes:
    """``obj`` (dicts, lists, bytes, small ints, uint8 arrays) pickled as Python 2's cPickle and
    NumPy 1.x wrote the real CIFAR-10 batches: protocol 2, memo numbered from 1, byte strings as
    ``str`` opcodes, ``numpy.core.multiarray._reconstruct`` with the dtype's flags as ints 0/1."""
    out, memo = bytearray(b"\x80\x02"), [0]

    def put() -> None:
        memo[0] += 1
        out.extend(b"q" + bytes([memo[0]]) if memo[0] < 256 else b"r" + memo[0].to_bytes(4, "little"))

    def dump(o) -> None:
        if isinstance(o, bytes):
            out.extend((b"U" + bytes([len(o)]) if len(o) < 256 else b"T" + len(o).to_bytes(4, "little")) + o)
            put()
        elif isinstance(o, int):
            out.extend(b"K" + bytes([o]) if 0 <= o < 256 else b"J" + o.to_bytes(4, "little", signed=True))
        elif isinstance(o, list):
            out.extend(b"]")
            put()
            for start in range(0, len(o), 1000):
                out.extend(b"(")
                for item in o[start:start + 1000]:
                    dump(item)
                out.extend(b"e")
        elif isinstance(o, dict):
            out.extend(b"}")
            put()
            out.extend(b"(")
            for k, v in o.items():
                dump(k)
                dump(v)
            out.extend(b"u")
        else:  # a uint8 ndarray, as NumPy 1.x's __reduce__ gives it
            out.extend(b"cnumpy.core.multiarray\n_reconstruct\n")
            put()
            out.extend(b"cnumpy\nndarray\nK\x00\x85U\x01b\x87R(K\x01(")
            for d in o.shape:
                dump(int(d))
            out.extend(b"tcnumpy\ndtype\nU\x02u1K\x00K\x01\x87R"  # dtype('u1', 0, 1), then its state
                       b"(K\x03U\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tbK\x00")
            dump(np.ascontiguousarray(o, dtype=np.uint8).tobytes())
            out.extend(b"tb")

    dump(obj)
    return bytes(out + b".")


def write_cifar10(root: str | Path, *, train_per_class: int = 40, test_per_class: int = 10, seed: int = 0,
                  python2: bool = False) -> Path:
    """``root/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}``; returns that folder.

    The training images are shuffled and dealt into the five batches, as in the real files;
    ``python2`` pickles them as the real files are (:func:`python2_pickle`), else with this
    Python's pickle.
    """
    rng = np.random.default_rng(seed)
    base = Path(root) / "cifar-10-batches-py"
    base.mkdir(parents=True, exist_ok=True)

    def make(per_class: int) -> tuple[np.ndarray, list[int]]:
        labels = rng.permutation(np.repeat(np.arange(10), per_class))
        images = np.stack([_image(rng, 32, _colour(int(c), 10), np.full(3, 96.0)) for c in labels])
        return images.transpose(0, 3, 1, 2).reshape(len(labels), 3072), labels.tolist()

    def write(name: str, obj: dict) -> None:
        (base / name).write_bytes(python2_pickle(obj) if python2 else pickle.dumps(obj))

    def dump(name: str, x: np.ndarray, y: list[int], label: str) -> None:
        write(name, {b"batch_label": label.encode(), b"labels": y, b"data": x,
                     b"filenames": [f"fixture_{name}_{i}.png".encode() for i in range(len(y))]})

    x, y = make(train_per_class)
    for i, part in enumerate(np.array_split(np.arange(len(y)), 5)):
        dump(f"data_batch_{i + 1}", x[part], [y[j] for j in part], f"training batch {i + 1} of 5")
    x, y = make(test_per_class)
    dump("test_batch", x, y, "testing batch 1 of 1")
    write("batches.meta", {b"num_cases_per_batch": int(np.ceil(10 * train_per_class / 5)),
                           b"label_names": [n.encode() for n in CIFAR_NAMES], b"num_vis": 3072})
    return base


def idx_bytes(array: np.ndarray) -> bytes:
    """``array`` (uint8, 1 or 3 dimensions) as an IDX file: magic 0x0801/0x0803, big-endian sizes, data."""
    header = (0x0800 + array.ndim).to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def write_fashion_mnist(root: str | Path, *, train_per_class: int = 6, test_per_class: int = 3, gz: bool = True,
                        seed: int = 0) -> Path:
    """``root/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]``, Fashion-MNIST's four IDX files;
    returns ``root``. Each 28x28 image is a bright bar whose position and orientation encode its
    class, on a noisy dark background, so a small model can learn the classes and a rotation
    changes the picture."""
    import gzip

    rng = np.random.default_rng(seed)
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)

    def make(per_class: int) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.permutation(np.repeat(np.arange(10), per_class)).astype(np.uint8)
        images = rng.integers(0, 40, size=(len(labels), 28, 28)).astype(np.uint8)
        for img, c in zip(images, labels):
            lo = 2 + 2 * (int(c) % 5)
            if c < 5:
                img[lo:lo + 3, 4:24] = 230
            else:
                img[4:24, lo:lo + 3] = 230
        return images, labels

    for prefix, per_class in (("train", train_per_class), ("t10k", test_per_class)):
        images, labels = make(per_class)
        for name, array in ((f"{prefix}-images-idx3-ubyte", images), (f"{prefix}-labels-idx1-ubyte", labels)):
            data = idx_bytes(array)
            if gz:
                (base / f"{name}.gz").write_bytes(gzip.compress(data, mtime=0))
            else:
                (base / name).write_bytes(data)
    return base


def write_all(outdir: str | Path, *, frames: int = 5, per_class: int = 5, size: int = 8, seed: int = 0) -> dict:
    """All four layouts under ``outdir``; returns {benchmark: root to pass as --root}."""
    outdir = Path(outdir)
    return {
        "core50": write_core50(outdir / "core50", frames=frames, size=size, npz=True, seed=seed),
        "office-home": write_office_home(outdir, per_class=per_class, size=size, seed=seed),
        "cifar10-dirichlet": write_cifar10(outdir, seed=seed),
        "fashion-mnist-split": write_fashion_mnist(outdir / "fashion-mnist", seed=seed),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/dataset_layouts.py",
                                     description="Write miniature CORe50, Office-Home, CIFAR-10 and Fashion-MNIST "
                                                 "in their official layouts.")
    parser.add_argument("outdir")
    parser.add_argument("--frames", type=int, default=5, help="CORe50 frames per session and object (default 5)")
    parser.add_argument("--per-class", type=int, default=5, help="Office-Home images per domain and class (default 5)")
    parser.add_argument("--size", type=int, default=8, help="image side in pixels for CORe50/Office-Home (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    roots = write_all(args.outdir, frames=args.frames, per_class=args.per_class, size=args.size, seed=args.seed)
    for name, root in roots.items():
        print(f"{name:18s} --root {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
