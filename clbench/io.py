"""Atomic file writes: a reader never sees half a file.

Every result, entry and checkpoint is written to a temporary file in the same directory,
flushed to disk, then renamed over the target (``os.replace`` is atomic on POSIX and Windows).
A crash leaves either the old file or the new one, never a truncated one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable


def _atomic(path: Path, write: Callable[[Any], None], mode: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
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


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as pretty JSON, atomically."""
    _atomic(Path(path), lambda h: h.write(json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n"), "w")


def write_text(path: str | Path, text: str) -> None:
    _atomic(Path(path), lambda h: h.write(text), "w")


def torch_save(path: str | Path, obj: Any) -> None:
    """``torch.save`` atomically (checkpoints)."""
    import torch

    _atomic(Path(path), lambda h: torch.save(obj, h), "wb")
