"""Read a dataset's pickle files without letting them run code.

Some official dataset formats are Python pickles (CIFAR-10's batches and ``batches.meta``,
CORe50's ``paths.pkl``), and unpickling a file runs whatever its ``__reduce__`` names: a copy
that someone else made or altered can carry a payload. :func:`load` unpickles with a
restricted unpickler (the recipe of the standard library's "Restricting Globals"): the
pickle's own opcodes build lists, dicts, tuples, strings, bytes and numbers; the only classes
and functions it may name are those NumPy arrays and dtypes are rebuilt with. Anything else
(``os.system``, ``builtins.eval``, any class) is refused before it is looked up, as a one-line
:class:`~clbench.errors.UserError` naming the file.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from clbench.errors import UserError

# (module, name) a dataset pickle may name: sets, bytes as protocols 0-2 write them from Python 3
# (_codecs.encode), and what numpy's ndarray/dtype/scalar __reduce__ return, under numpy 1's
# (numpy.core) and numpy 2's (numpy._core) module names.
ALLOWED = frozenset({
    ("_codecs", "encode"), ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "bytearray"), ("builtins", "complex"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    *((f"{core}.multiarray", name) for core in ("numpy.core", "numpy._core") for name in ("_reconstruct", "scalar")),
    *((f"{core}.numeric", "_frombuffer") for core in ("numpy.core", "numpy._core")),
})


class Refused(pickle.UnpicklingError):
    """The pickle names a global outside :data:`ALLOWED`."""

    def __init__(self, module: str, name: str):
        super().__init__(f"{module}.{name}")
        self.module, self.name = module, name


def _python3_name(module: str, name: str) -> tuple[str, str]:
    """A Python 2 pickle's name for a global (``__builtin__.set``) as Python 3 finds it (``builtins.set``)."""
    import _compat_pickle

    return _compat_pickle.NAME_MAPPING.get((module, name), (_compat_pickle.IMPORT_MAPPING.get(module, module), name))


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED and _python3_name(module, name) not in ALLOWED:
            raise Refused(module, name)
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not part of a dataset file")


def load(path: str | Path, *, fix: str, encoding: str = "ASCII") -> Any:
    """The object pickled in ``path``, built only from plain containers, numbers, strings and
    NumPy arrays; a :class:`UserError` naming the file (and ``fix``) if it names anything else.

    Errors of a damaged file (``OSError``, ``EOFError``, ``pickle.UnpicklingError``...) are
    raised as they are, for the reader to word."""
    with open(path, "rb") as f:
        try:
            return _Restricted(f, encoding=encoding).load()
        except Refused as err:
            raise UserError(f"refused to unpickle: the file names {err.module}.{err.name}, and a dataset file holds "
                            "only lists, dicts, strings, numbers and NumPy arrays (unpickling it could run code)",
                            where=str(path), fix=fix) from None
