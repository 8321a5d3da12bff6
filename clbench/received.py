"""Reading a file that may come from someone else (a leaderboard folder they sent): a regular
file of bounded size and nesting, or one line of :class:`~clbench.errors.UserError` naming it.

A plain ``read_text`` of such a file trusts what it is: a ``suite.json`` that links to
``/dev/zero`` reads until memory runs out, a named pipe blocks the command forever, and JSON
nested 200,000 levels deep raises ``RecursionError`` in every reader after it. Here a file is
read only if it is (or links to) a regular file, opened without blocking; at most
:data:`MAX_BYTES` are read, and JSON nested deeper than :data:`MAX_DEPTH` is refused, so the
code that walks it afterwards never meets a depth it cannot handle.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

from clbench.errors import UserError

#: The most bytes read from one file: the largest committed entry (a language model's, with
#: its samples) is about 2 MiB.
MAX_BYTES = 256 * 2**20
#: The deepest nesting of JSON read: entries and manifests are 6 levels deep, a config's
#: arguments a few more.
MAX_DEPTH = 64

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _not_regular(path: Path, mode: int, fix: str) -> UserError:
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    try:
        link = f"a symbolic link to {os.readlink(path)}, which is " if path.is_symlink() else ""
    except OSError:
        link = ""
    return UserError(f"{link}{kind}, where a regular file is expected (it is not read)", where=str(path), fix=fix)


def check_regular(path: str | Path, *, fix: str) -> os.stat_result:
    """``path``'s status if it is (or links to) a regular file, else one line saying what it is:
    refused before it is opened, as opening a device can have effects and a pipe blocks."""
    path = Path(path)
    try:
        info = os.stat(path)
    except OSError as err:
        denied = err.errno in (errno.EACCES, errno.EPERM)
        raise UserError(f"cannot read: {err.strerror}", where=str(path),
                        fix="check the file's permissions" if denied else fix) from None
    if not stat.S_ISREG(info.st_mode):
        raise _not_regular(path, info.st_mode, fix)
    return info


def read_bytes(path: str | Path, *, fix: str, limit: int = MAX_BYTES,
               bound: str = "clbench reads from one file") -> bytes:
    """The bytes of ``path`` if it is a regular file (:func:`check_regular`) of at most ``limit``
    bytes; ``bound`` says in the refusal where the limit comes from."""
    path = Path(path)
    check_regular(path, fix=fix)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as err:
        denied = err.errno in (errno.EACCES, errno.EPERM)
        raise UserError(f"cannot read: {err.strerror}", where=str(path),
                        fix="check the file's permissions" if denied else fix) from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())  # what was opened, should the file have been swapped meanwhile
        if not stat.S_ISREG(info.st_mode):
            raise _not_regular(path, info.st_mode, fix)
        data = handle.read(limit + 1) if info.st_size <= limit else b""
    if info.st_size > limit or len(data) > limit:
        size = max(info.st_size, len(data))
        raise UserError(f"{size} bytes, more than the {limit} {bound} (it is not read)", where=str(path), fix=fix)
    return data


def read_text(path: str | Path, *, fix: str, limit: int = MAX_BYTES) -> str:
    """``path``'s UTF-8 text, read as :func:`read_bytes` reads it."""
    try:
        return read_bytes(path, fix=fix, limit=limit).decode("utf-8")
    except UnicodeDecodeError:
        raise UserError("not a UTF-8 text file", where=str(path), fix=fix) from None


def _deeper_than(value: Any, depth: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``depth`` levels deep (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            if level > depth:
                return True
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def read_json(path: str | Path, *, fix: str, limit: int = MAX_BYTES, depth: int = MAX_DEPTH) -> Any:
    """``path`` parsed as JSON, read as :func:`read_text` reads it, nested at most ``depth`` levels deep."""
    text = read_text(path, fix=fix, limit=limit)
    deep = UserError(f"JSON nested more than {depth} levels deep (it is not read further)", where=str(path), fix=fix)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"not valid JSON (line {err.lineno}, column {err.colno}): {err.msg}", where=str(path),
                        fix=fix) from None
    except RecursionError:
        raise deep from None
    except ValueError as err:  # e.g. an integer of more digits than Python converts
        raise UserError(f"not valid JSON: {str(err).split(':')[0]}", where=str(path), fix=fix) from None
    if _deeper_than(data, depth):
        raise deep
    return data
