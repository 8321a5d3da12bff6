"""Warnings and progress bars that installed packages print are not the user's business.

A dependency that warns at import (a solver library that finds no backend, a deprecation
inside a framework) would otherwise add lines to every command's output, and a one-line error
would no longer be one line. The CLI routes a warning to the ``clbench.dependencies`` logger
(debug level) when the code it is attributed to lives in an installed package
(``site-packages``/``dist-packages``) or the standard library. Warnings raised by clbench and by
the user's own plugin files are attributed to those files and still show.

``CLBENCH_SHOW_WARNINGS=1``, ``python -W ...`` or ``PYTHONWARNINGS`` keep Python's own handling.
transformers' progress bars are off while clbench loads a model (:func:`no_progress_bars`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import sysconfig
import warnings
from pathlib import PurePath
from typing import Iterator

_INSTALLED = ("site-packages", "dist-packages")


def is_dependency_file(filename: str) -> bool:
    """Whether ``filename`` belongs to an installed package or the standard library."""
    if not filename or filename.startswith("<"):
        return True  # frozen importlib and other synthetic frames: never the user's code
    parts = PurePath(filename).parts
    if any(part in _INSTALLED for part in parts):
        return True
    stdlib = sysconfig.get_paths().get("stdlib")
    return bool(stdlib) and os.path.abspath(filename).startswith(os.path.abspath(stdlib) + os.sep)


def route_dependency_warnings() -> bool:
    """Install the policy for this process; returns False where the user chose their own."""
    if sys.warnoptions or os.environ.get("CLBENCH_SHOW_WARNINGS", "") not in ("", "0"):
        return False
    show = warnings.showwarning
    log = logging.getLogger("clbench.dependencies")

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if is_dependency_file(filename):
            log.debug("%s:%s: %s: %s", filename, lineno, category.__name__, message)
            return
        show(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning
    return True


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' own progress bars off for the duration: 5.x draws one per model load
    ("Loading weights"), which a run reports itself and which ``leaderboard verify`` would print
    once per entry."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()
