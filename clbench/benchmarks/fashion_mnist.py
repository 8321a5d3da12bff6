"""Fashion-MNIST (Xiao, Rasul and Vollgraf, 2017) read from its official IDX files.

Zalando publishes the dataset as four IDX files, gzipped: ``train-images-idx3-ubyte.gz``
(60,000 28x28 grey-scale images), ``train-labels-idx1-ubyte.gz``, ``t10k-images-idx3-ubyte.gz``
and ``t10k-labels-idx1-ubyte.gz`` (10,000 test images). Debian and Ubuntu ship exactly these
four files in the package ``dataset-fashion-mnist``, under ``/usr/share/datasets/fashion-mnist``.
A folder may hold each file gzipped or not (``name.gz`` or ``name``).

``root`` defaults to that Debian folder, then ``fashion-mnist/`` in clbench's cache
(``$CLBENCH_CACHE_DIR`` or the platform's user cache, as for fetched models). Every file is
checked before it is used: a missing one, a gzip stream cut short, an IDX header of the wrong
type, declaring more items than the official file, or a payload shorter or longer than its
header declares is one :class:`UserError` that names the file and where to get it. The header is
read first and the payload inflated in chunks up to the size it declares, so a small ``.gz``
that inflates to gigabytes is refused after one byte too many. With ``verify="md5"`` (the
default) the header must declare the official count and the decompressed bytes must match the
MD5s published for the official release. The published MD5s of the ``.gz`` files do not apply:
Debian recompresses them (no stored file name, another timestamp), while the decompressed
contents are byte-identical, so the check is on the contents (which the size bound makes safe
to inflate). ``verify="header"`` skips the MD5 and takes any count up to the official one (for
subsets and the tests' miniature trees).

Parsing is ``np.frombuffer`` on the header-checked bytes (no pickle, no per-image decoding);
the arrays are read once per process and kept (:func:`load`).
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn

import numpy as np

from clbench.config.validation import ArgumentError
from clbench.errors import UserError

DEBIAN_ROOT = "/usr/share/datasets/fashion-mnist"
CACHE_FOLDER = "fashion-mnist"
SOURCE = "https://github.com/zalandoresearch/fashion-mnist"
FIX = (f"install the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist), or download the "
       f"four .gz files linked from {SOURCE} into that folder")
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
               "Ankle boot")
SIDE = 28
CHUNK = 1 << 20  # bytes inflated at a time
Verify = Literal["md5", "header"]


@dataclass(frozen=True)
class IdxFile:
    """One of the four official files: its name (without ``.gz``), what its header must say,
    and the MD5 of its decompressed contents (published with the dataset)."""

    name: str
    magic: int  # 0x0803: unsigned bytes, 3 dimensions (images); 0x0801: 1 dimension (labels)
    count: int  # in the official release
    md5: str
    gz_md5: str  # of Zalando's own .gz download (recorded for reference; see the module docstring)

    @property
    def dims(self) -> int:
        return self.magic & 0xFF


FILES = {
    "train_images": IdxFile("train-images-idx3-ubyte", 0x0803, 60000, "f4a8712d7a061bf5bd6d2ca38dc4d50a",
                            "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
    "train_labels": IdxFile("train-labels-idx1-ubyte", 0x0801, 60000, "9018921c3c673c538a1fc5bad174d6f9",
                            "25c81989df183df01b3e8a0aad5dffbe"),
    "test_images": IdxFile("t10k-images-idx3-ubyte", 0x0803, 10000, "8181f5470baa50b63fa0f6fddb340f0a",
                           "bef4ecab320f06d8554ea6380940ec79"),
    "test_labels": IdxFile("t10k-labels-idx1-ubyte", 0x0801, 10000, "15d484375f8d13e6eb1aabb0c3f46965",
                           "bb300cfdad3c16e7a12a480ee83cd310"),
}


def cache_folder() -> Path:
    from clbench.models.lm.gguf import cache_root

    return cache_root() / CACHE_FOLDER


def default_roots() -> list[Path]:
    """Where ``root: null`` looks, in order: the Debian package's folder, then clbench's cache."""
    return [Path(DEBIAN_ROOT), cache_folder()]


def _file_in(base: Path, spec: IdxFile) -> Path | None:
    for candidate in (base / f"{spec.name}.gz", base / spec.name):
        if candidate.is_file():
            return candidate
    return None


def locate(root: str | None) -> Path:
    """The folder to read: ``root``, or the first default folder holding all four files."""
    base = _default_root() if root is None else Path(root).expanduser()
    if not base.is_dir():
        raise UserError("Fashion-MNIST root is not a folder" if base.exists() else "Fashion-MNIST root does not exist",
                        where=str(base), fix=FIX)
    return base


def installed_root() -> Path | None:
    """The first of :func:`default_roots` that holds all four files (None: none does)."""
    return next((base for base in default_roots() if all(_file_in(base, spec) for spec in FILES.values())), None)


def _default_root() -> Path:
    """The first of :func:`default_roots` that holds all four files."""
    found = installed_root()
    if found is None:
        tried = " or ".join(str(p) for p in default_roots())
        raise ArgumentError("benchmark", "root", f"Fashion-MNIST not found in {tried}",
                            fix=f"{FIX}, or set root to the folder holding them")
    return found


def _open(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def parse_header(header: bytes, spec: IdxFile, where: str) -> tuple[int, ...]:
    """The shape an IDX header declares, after checking it against ``spec`` (big-endian: 2 zero
    bytes, type 0x08, dimension count, then one uint32 per dimension)."""
    if len(header) < 4 + 4 * spec.dims:
        raise UserError(f"truncated IDX file: {len(header)} bytes, shorter than its {4 + 4 * spec.dims}-byte header",
                        where=where, fix=f"re-download it: {FIX}")
    magic = int.from_bytes(header[:4], "big")
    if magic != spec.magic:
        raise UserError(f"IDX header says type 0x{magic:08x}, expected 0x{spec.magic:08x} "
                        f"({'images' if spec.dims == 3 else 'labels'} as unsigned bytes)", where=where,
                        fix=f"this is not {spec.name}; re-download it: {FIX}")
    shape = tuple(int.from_bytes(header[4 + 4 * i:8 + 4 * i], "big") for i in range(spec.dims))
    if spec.dims == 3 and shape[1:] != (SIDE, SIDE):
        raise UserError(f"IDX header says {shape[1]}x{shape[2]} images, expected {SIDE}x{SIDE}", where=where,
                        fix=f"re-download it: {FIX}")
    return shape


def _check_count(count: int, spec: IdxFile, verify: Verify, where: str) -> None:
    """The official count (``md5``) or at most it (``header``): checked before the payload is read,
    so a header declaring billions of items allocates nothing."""
    if verify == "md5" and count != spec.count:
        raise UserError(f"{count} items, the official file has {spec.count}", where=where,
                        fix=f"re-download it ({FIX}), or set verify: header to read a subset")
    if count > spec.count:
        raise UserError(f"IDX header declares {count} items, more than the official file's {spec.count}", where=where,
                        fix=f"verify: header reads the official files or a subset of them; re-download them: {FIX}")


def read_idx(path: Path, spec: IdxFile, verify: Verify = "md5") -> np.ndarray:
    """The uint8 array of one IDX file (gzipped or not), read in chunks up to the size its checked
    header declares: a gzip stream that inflates to more (a decompression bomb) is refused after
    one byte more, and a file longer or shorter than declared is named."""
    where = str(path)
    header_len = 4 + 4 * spec.dims
    try:
        with _open(path) as f:
            header = f.read(header_len)
            shape = parse_header(header, spec, where)
            _check_count(shape[0], spec, verify, where)
            size = math.prod(shape)
            expected = header_len + size
            length = os.fstat(f.fileno()).st_size if path.suffix != ".gz" else expected
            if length != expected:
                _wrong_length(length, expected, shape, where)
            data = bytearray(size)
            view, done = memoryview(data), 0
            while done < size:
                got = f.readinto(view[done:done + CHUNK])
                if not got:
                    _wrong_length(header_len + done, expected, shape, where)
                done += got
            if f.read(1):
                raise UserError(f"IDX file longer than its header says: more than the {expected} bytes its header "
                                f"({shape[0]} items) declares", where=where, fix=f"re-download it: {FIX}")
    except EOFError:
        raise UserError("truncated gzip file (the stream ends early)", where=where, fix=f"re-download it: {FIX}") \
            from None
    except (gzip.BadGzipFile, zlib.error) as err:
        raise UserError(f"not a valid gzip file ({err})", where=where, fix=f"re-download it: {FIX}") from None
    except OSError as err:
        raise UserError(f"cannot read the file ({err.strerror or err})", where=where, fix=FIX) from None
    if verify == "md5":
        digest = hashlib.md5(header)
        digest.update(data)
        if digest.hexdigest() != spec.md5:
            raise UserError(f"contents' MD5 {digest.hexdigest()} is not the official {spec.md5}", where=where,
                            fix=f"re-download it ({FIX}), or set verify: header to read other data in this layout")
    return np.frombuffer(data, dtype=np.uint8).reshape(shape)


def _wrong_length(length: int, expected: int, shape: tuple[int, ...], where: str) -> NoReturn:
    what = "truncated IDX file" if length < expected else "IDX file longer than its header says"
    raise UserError(f"{what}: {length} bytes, its header ({shape[0]} items) needs {expected}", where=where,
                    fix=f"re-download it: {FIX}")


def read_file(base: Path, key: str, verify: Verify = "md5") -> np.ndarray:
    """One of :data:`FILES` from ``base``, checked (see the module docstring)."""
    spec = FILES[key]
    path = _file_in(base, spec)
    if path is None:
        raise UserError(f"Fashion-MNIST file {spec.name}.gz (or {spec.name}) missing",
                        where=str(base / f"{spec.name}.gz"), fix=FIX)
    return read_idx(path, spec, verify)


@dataclass(frozen=True)
class FashionMNIST:
    """The whole dataset in memory: images uint8 (N, 28, 28), labels int64 (N,)."""

    root: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


_LOADED: dict[tuple, FashionMNIST] = {}


def load(root: str | None = None, verify: Verify = "md5") -> FashionMNIST:
    """The four files from ``root`` (see :func:`locate`), read once per process and kept
    (keyed by the files' paths, sizes and modification times)."""
    base = locate(root)
    stats = []
    for spec in FILES.values():
        path = _file_in(base, spec)
        st = path.stat() if path else None
        stats.append((str(path), st.st_size, st.st_mtime_ns) if st else None)
    key = (str(base.resolve()), verify, tuple(stats))
    if key not in _LOADED:
        x_tr, y_tr, x_te, y_te = (read_file(base, k, verify) for k in FILES)
        for images, labels, name in ((x_tr, y_tr, "train"), (x_te, y_te, "t10k")):
            if len(images) != len(labels):
                raise UserError(f"{len(images)} {name} images but {len(labels)} {name} labels", where=str(base),
                                fix=f"the images and labels files are from different releases: {FIX}")
            if len(labels) and labels.max() >= len(CLASS_NAMES):
                raise UserError(f"{name} labels outside 0..9 (max {labels.max()})", where=str(base),
                                fix=f"re-download the labels file: {FIX}")
        _LOADED.clear()  # one dataset kept at a time: a run reads one root
        _LOADED[key] = FashionMNIST(str(base), x_tr, y_tr.astype(np.int64), x_te, y_te.astype(np.int64))
    return _LOADED[key]
