"""Atomic file writes: a reader never sees half a file.

Every result, entry and checkpoint is written to a temporary file in the same directory
(``.<name>.<random>.tmp``), flushed to disk, then renamed over the target (``os.replace`` is
atomic on POSIX and Windows), and the directory entry is flushed too. A crash leaves either
the old file or the new one, never a truncated one; at worst a stray temporary file, which
:func:`remove_stale_temporaries` clears and no reader mistakes for the real thing.

A full disk, an exceeded quota, a read-only filesystem or a folder without write permission
(``ENOSPC``, ``EDQUOT``, ``EROFS``, ``EACCES``) is raised as one-line bad input naming the
file (:func:`clbench.errors.unwritable`); the old file is untouched, as after a crash.

The new file gets the permissions an ordinary ``open()`` would give it (``0o666`` less the
umask), or the replaced file's, not the ``0o600`` of a bare temporary file.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows, where directories cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | Path, write: Callable[[Any], None], mode: str = "w") -> None:
    """Call ``write(handle)`` on a temporary file next to ``path`` and rename it over ``path``."""
    from clbench.errors import unwritable

    path = Path(path)
    try:
        _atomic_write(path, write, mode)
    except OSError as err:
        reported = unwritable(err, path)
        if reported is None:
            raise
        raise reported from None


def _atomic_write(path: Path, write: Callable[[Any], None], mode: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if hasattr(os, "fchmod"):  # POSIX; on Windows the temporary file's mode is already ordinary
            try:
                perms = stat.S_IMODE(path.stat().st_mode)
            except FileNotFoundError:
                perms = _default_mode()
            os.fchmod(fd, perms)
        with os.fdopen(fd, mode) as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


class _WriteErrors:
    """A file handle that remembers the ``OSError`` a write raised: ``torch.save`` reports a
    failed write (a full disk) as a bare ``RuntimeError`` and loses the cause."""

    def __init__(self, handle):
        self.handle = handle
        self.error: OSError | None = None

    def write(self, data):
        try:
            return self.handle.write(data)
        except OSError as err:
            self.error = err
            raise

    def __getattr__(self, name):
        return getattr(self.handle, name)


def remove_stale_temporaries(folder: str | Path, name: str) -> None:
    """Delete temporary files a killed writer of ``folder/name`` left behind."""
    for stale in Path(folder).glob(f".{name}.*.tmp"):
        stale.unlink(missing_ok=True)


def json_text(obj: Any) -> str:
    """``obj`` as the pretty, strict JSON (no NaN) that :func:`write_json` writes: nested
    objects indented, and a list of plain values (an R-matrix row, a routing record) on one
    line, so a long stream's matrices stay readable and a fraction of the indented size."""
    return _pretty(obj, 0) + "\n"


def _pretty(obj: Any, depth: int) -> str:
    pad = "  " * depth
    if isinstance(obj, dict) and obj:
        items = (f"{pad}  {json.dumps(key)}: {_pretty(value, depth + 1)}" for key, value in obj.items())
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(obj, (list, tuple)) and any(isinstance(x, (dict, list, tuple)) for x in obj):
        items = (f"{pad}  {_pretty(value, depth + 1)}" for value in obj)
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return json.dumps(obj, allow_nan=False)


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as pretty JSON, atomically."""
    atomic_write(Path(path), lambda h: h.write(json_text(obj)), "w")


def write_text(path: str | Path, text: str) -> None:
    atomic_write(Path(path), lambda h: h.write(text), "w")


def torch_save(path: str | Path, obj: Any) -> None:
    """``torch.save`` atomically (checkpoints)."""
    import torch

    def save(handle) -> None:
        recording = _WriteErrors(handle)
        try:
            torch.save(obj, recording)
        except RuntimeError:
            if recording.error is not None:
                raise recording.error from None
            raise

    atomic_write(Path(path), save, "wb")
