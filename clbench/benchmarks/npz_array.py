"""One array of an ``.npz`` archive, memory-mapped when stored, its header checked before any of it is read.

``np.load`` cannot memory-map a member of an npz archive, and reading CORe50's 8 GB
``core50_imgs.npz`` into every process is slow and wasteful. An uncompressed zip member is a
plain ``.npy`` file at a fixed offset, so it is mapped directly; a compressed one is read into
memory once, in chunks.

The archive may come from anyone, and ``np.load`` allocates whatever shape a member's header
declares before it reads a byte of data (a header claiming (1e6, 128, 128, 3) asks for 46
GiB). So the ``.npy`` header is read first (``numpy.lib.format``'s magic and header readers,
which only parse) and checked: no Python objects, at most ``max_shape`` (the dataset's own
size), and exactly as many bytes after the header as the shape needs, by the archive's own
record of the member's size. Anything wrong is one :class:`~clbench.errors.UserError` naming
the file and the member.
"""

from __future__ import annotations

import math
import os
import struct
import zipfile
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

from clbench.errors import UserError

CHUNK = 1 << 24  # bytes read at a time from a compressed member
DEFAULT_FIX = "re-download the file; it is truncated or not the official one"


class Member(NamedTuple):
    """What a member's ``.npy`` header says, and where its data starts."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool
    start: int  # the data's offset inside the member (the header's length)
    file_offset: int | None  # the data's offset in the archive file, for a stored member


class NpzArray:
    """The array ``key`` of the npz archive ``path``; ``max_shape`` bounds each dimension (None:
    any) and fixes the number of dimensions. Pickling keeps only the file name and bounds, so
    worker processes reopen the map instead of receiving a copy of the data."""

    def __init__(self, path: str | Path, key: str, *, max_shape: tuple[int | None, ...] | None = None,
                 fix: str = DEFAULT_FIX):
        self.path = str(path)
        self.key = key
        self.max_shape = max_shape
        self.fix = fix
        self._array: np.ndarray | None = None
        self._member: Member | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_array": None}

    @property
    def member(self) -> Member:
        """The checked header (read once; nothing of the data is read)."""
        if self._member is None:
            self._member = self._read_header()
        return self._member

    @property
    def shape(self) -> tuple[int, ...]:
        return self.member.shape

    @property
    def dtype(self) -> np.dtype:
        return self.member.dtype

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            self._array = self._open()
        return self._array

    def _error(self, what: str) -> UserError:
        return UserError(what, where=f"{self.path}: {self.key}.npy", fix=self.fix)

    def _read_header(self) -> Member:
        import numpy.lib.format as npy

        readers = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}
        name = f"{self.key}.npy"
        try:
            with zipfile.ZipFile(self.path) as archive:
                try:
                    info = archive.getinfo(name)
                except KeyError:
                    raise UserError(f"npz archive has no array '{self.key}'", where=self.path, fix=self.fix) from None
                with archive.open(info) as f:
                    try:
                        version = npy.read_magic(f)
                        if version not in readers:
                            raise self._error(f".npy format version {version[0]}.{version[1]}, where this reader "
                                              "takes 1.0 and 2.0 (what NumPy writes for arrays of numbers)")
                        shape, fortran, dtype = readers[version](f)
                    except (UserError, zipfile.BadZipFile, OSError, EOFError, zlib.error):
                        raise
                    except Exception as err:  # noqa: BLE001 - numpy's parser: ValueError, SyntaxError, TypeError...
                        raise self._error(f"unreadable .npy header ({' '.join(str(err).split())[:160]})") from None
                    start = f.tell()
                local = self._data_start(info) if info.compress_type == zipfile.ZIP_STORED else None
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error, struct.error) as err:
            raise UserError(f"cannot read npz archive ({err})", where=self.path,
                            fix="re-download the file; it is truncated or corrupt") from None
        self._check(shape, dtype, start, info.file_size)
        offset = None if local is None else local + start
        if offset is not None and offset + (info.file_size - start) > os.path.getsize(self.path):
            raise self._error("the member runs past the end of the archive (a truncated file)")
        return Member(tuple(shape), dtype, bool(fortran), start, offset)

    def _check(self, shape: tuple, dtype: np.dtype, start: int, member_size: int) -> None:
        """Refuse a header whose array is not numbers, exceeds ``max_shape``, or needs more or
        fewer bytes than the member holds after the header."""
        if dtype.hasobject:
            raise self._error(f"the array holds Python objects (dtype {dtype}), where a dataset array holds numbers")
        bounds = self.max_shape
        beyond = bounds is not None and any(b is not None and d > b for d, b in zip(shape, bounds))
        if bounds is not None and (len(shape) != len(bounds) or beyond):
            limit = "(" + ", ".join("any" if b is None else str(b) for b in bounds) + ")"
            raise self._error(f"the header declares shape {tuple(shape)}, beyond the dataset's {limit}")
        need = math.prod(shape) * dtype.itemsize
        if start + need != member_size:
            raise self._error(f"the header declares shape {tuple(shape)} of {dtype} ({need} bytes), but the member "
                              f"holds {max(member_size - start, 0)} bytes after its {start}-byte header")

    def _data_start(self, info: zipfile.ZipInfo) -> int:
        """Where a stored member's bytes start in the archive: after its local file header."""
        with open(self.path, "rb") as f:
            f.seek(info.header_offset)
            local = struct.unpack(zipfile.structFileHeader, f.read(zipfile.sizeFileHeader))
        name_len, extra_len = local[-2], local[-1]  # the local header ends with these two lengths
        return info.header_offset + zipfile.sizeFileHeader + name_len + extra_len

    def _open(self) -> np.ndarray:
        m = self.member
        order = "F" if m.fortran else "C"
        nbytes = math.prod(m.shape) * m.dtype.itemsize
        if nbytes == 0:
            return np.empty(m.shape, m.dtype, order=order)
        if m.file_offset is not None:
            return np.memmap(self.path, dtype=m.dtype, mode="r", offset=m.file_offset, shape=m.shape, order=order)
        flat = np.empty(nbytes, np.uint8)
        view = memoryview(flat)
        try:
            with zipfile.ZipFile(self.path) as archive, archive.open(f"{self.key}.npy") as f:
                f.read(m.start)
                done = 0
                while done < nbytes:
                    chunk = f.read(min(CHUNK, nbytes - done))
                    if not chunk:
                        raise self._error(f"the member ends after {done} of its {nbytes} bytes (a truncated file)")
                    view[done:done + len(chunk)] = chunk
                    done += len(chunk)
                f.read(1)  # reach the end, where zipfile checks the CRC
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as err:
            raise self._error(f"cannot read the member ({err})") from None
        return flat.view(m.dtype).reshape(m.shape, order=order)
