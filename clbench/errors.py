"""The one error type for bad input.

Every problem a user can fix (a missing file, an unknown name, a value of the wrong type, a
dataset folder that is not where it should be) is raised as :class:`UserError`. The CLI prints
its one-line message and exits with status 2, without a traceback. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Callable


class UserError(Exception):
    """Bad input, reported as ``<where>: <what is wrong> (<how to fix it>)`` on one line.

    ``where`` names the file and/or the config field (``configs/x.yaml: strategy.init_args.lr``).
    """

    exit_code = 2

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None):
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(self.one_line())

    def one_line(self) -> str:
        text = f"{self.where}: {self.what}" if self.where else self.what
        if self.fix:
            text += f" ({self.fix})"
        return " ".join(text.split())


def closest(name: str, choices) -> str | None:
    """The choice ``name`` most likely misspells (rapidfuzz), or None."""
    try:
        from rapidfuzz import process
    except ImportError:  # pragma: no cover - rapidfuzz is a hard dependency
        return None
    best = process.extractOne(name, sorted(choices), score_cutoff=60)
    return best[0] if best else None


def did_you_mean(name: str, choices) -> str:
    """``"did you mean 'x'? valid: a, b, c"``: the close match (rapidfuzz) and the full list."""
    choices = sorted(choices)
    best = closest(name, choices)
    return f"{f'did you mean {best!r}? ' if best else ''}valid: {', '.join(choices)}"


class NonFiniteScore(UserError):
    """An evaluation gave NaN where R needs a number (a model whose outputs are not finite):
    the run stops and, in a suite, is recorded as failed."""


class NonFiniteLoss(UserError):
    """Training diverged (NaN/Inf loss): the run stops and, in a suite, is recorded as failed."""

    def __init__(self, what: str, *, where: str | None = "training",
                 fix: str | None = "lower the learning rate, or check the data, the model and the strategy's loss",
                 value: float | None = None):
        self.value = value  # the non-finite mean loss, for a caller that rewords the message
        super().__init__(what, where=where, fix=fix)


# A full disk, an exceeded quota, a read-only filesystem, a folder without write permission:
# the user fixes these, so they are bad input, not bugs.
UNWRITABLE_ERRNOS = frozenset(getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM")
                              if hasattr(errno, name))


class Unwritable(UserError):
    """A write failed for a reason the user fixes (full disk, quota, read-only, permissions)."""


def unwritable(err: BaseException, path=None, *, folder=None) -> Unwritable | None:
    """``err`` as a one-line :class:`UserError` naming ``path`` (a file being written) or the
    path in ``err`` when it is an unwritable-disk or permission error, else None. A permission
    error from an unknown operation (maybe a read) says "cannot access", not "cannot write".
    A write's own ``OSError`` (``ENOSPC`` from ``write()`` or ``close()``) holds no file name:
    then ``folder``, the folder the failing command writes into, is named instead of "a file"."""
    if not isinstance(err, OSError) or err.errno not in UNWRITABLE_ERRNOS:
        return None
    if path is None and not err.filename and folder is not None:
        path = f"a file while writing into {folder}"
    where = str(path if path is not None else (err.filename or "a file"))
    reason = err.strerror or os.strerror(err.errno)
    if err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        fix = "free space (or quota) on that filesystem and run the command again"
    elif err.errno == errno.EROFS:
        fix = "the filesystem is mounted read-only: remount it writable or choose another folder"
    elif path is not None:
        fix = "make it writable for this user or choose another folder"
    else:
        return Unwritable(f"cannot access {where}: {reason}",
                          fix="give this user access to it, or choose another path")
    return Unwritable(f"cannot write {where}: {reason}", fix=fix)


INTERRUPTED = 130  # a process stopped by Ctrl-C (SIGINT) exits as a shell reports it


def exit_status(command: Callable[[], int | None], interrupted: str) -> int:
    """Run a process's ``command`` and return its exit status, ending the way every clbench
    process ends: bad input (:class:`UserError`, or a disk the user must free or make writable)
    prints one ``clbench: error:`` line on stderr and returns 2; Ctrl-C prints ``interrupted``
    and returns 130. Anything else is a bug and keeps its traceback."""
    try:
        return int(command() or 0)
    except UserError as err:
        reported = err
    except OSError as err:  # a write outside clbench.io (a log, a folder) on a full or read-only disk
        reported = unwritable(err)
        if reported is None:
            raise
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr)
        return INTERRUPTED
    print(f"clbench: error: {reported.one_line()}", file=sys.stderr)
    return reported.exit_code
