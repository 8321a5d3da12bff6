"""Read a dataset's pickle files without letting them run code or exhaust the machine.

Some official dataset formats are Python pickles (CIFAR-10's batches and ``batches.meta``,
CORe50's ``paths.pkl``), and unpickling a file runs whatever its ``__reduce__`` names: a copy
that someone else made or altered can carry a payload. :func:`load` reads such a file in two
steps, and anything wrong is one :class:`~clbench.errors.UserError` naming the file:

1. :func:`clbench.data.pickle_scan.scan` reads the opcodes without building anything, and
   refuses a global outside :data:`ALLOWED` (``os.system``, ``builtins.eval``, any class), more
   objects than a file of its size holds, and nesting deep enough to crash Python.
2. It unpickles with a restricted unpickler (the standard library's "Restricting Globals"
   recipe) whose allowed names resolve to checking stand-ins, not to the real callables: each
   checks its arguments first, so that no call allocates more than the file holds (an array's
   declared shape must match the bytes that come with it; object arrays, ``bytearray(n)`` and
   ``numpy.ndarray(shape)`` are not reachable at all). Any exception the unpickler raises is
   reported the same one-line way.

What the result holds is for the reader to check (types, shapes, ranges).
"""

from __future__ import annotations

import io
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from clbench.data.pickle_scan import Refusal, scan
from clbench.errors import UserError

#: A dataset pickle larger than this is refused before it is read.
DEFAULT_MAX_BYTES = 256 << 20
_RULE = "a dataset file holds only lists, dicts, strings, numbers and NumPy arrays"


class Refused(pickle.UnpicklingError):
    """The pickle names a global outside :data:`ALLOWED`."""

    def __init__(self, module: str, name: str):
        super().__init__(f"{module}.{name}")
        self.module, self.name = module, name


# -- what the allowed names resolve to: stand-ins that raise Refusal for arguments no pickler writes --

def _core(module: str, name: str) -> Any:
    """NumPy's own function, from numpy 2's ``numpy._core`` or numpy 1's ``numpy.core``."""
    import importlib

    for core in ("numpy._core", "numpy.core"):
        try:
            return getattr(importlib.import_module(f"{core}.{module}"), name)
        except (ImportError, AttributeError):
            continue
    raise Refusal(f"this NumPy has no {module}.{name}")


def _latin1(value: Any, what: str) -> bytes:
    """Bytes as a pickle may carry them: bytes, or a Python 2 str read as latin-1."""
    if isinstance(value, (bytes, bytearray)):
        return value
    if isinstance(value, str):
        try:
            return value.encode("latin-1")
        except UnicodeEncodeError:
            raise Refusal(f"{what} is text outside latin-1, where bytes belong") from None
    raise Refusal(f"{what} is a {type(value).__name__}, where bytes belong")


def _shape(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple) or not all(type(d) is int and d >= 0 for d in value) or len(value) > 32:
        raise Refusal(f"{what} is not a tuple of at most 32 non-negative ints")
    return value


def _plain_dtype(value: Any, what: str) -> np.dtype:
    if not isinstance(value, np.dtype):
        raise Refusal(f"{what} is a {type(value).__name__}, not a NumPy dtype")
    if value.hasobject:
        raise Refusal(f"{what} holds Python objects ({value}); {_RULE} of numbers")
    return value


def _sized(shape: tuple[int, ...], dtype: np.dtype, data: bytes, what: str) -> None:
    """Refuse an array whose declared size is not the size of the bytes that come with it."""
    need = math.prod(shape) * dtype.itemsize
    if need != len(data):
        raise Refusal(f"{what} declares shape {shape} of {dtype} ({need} bytes) but carries {len(data)} bytes")


def _encode(text: Any = "", encoding: Any = "utf-8", errors: Any = "strict") -> bytes:
    """``_codecs.encode(text, 'latin1')``: how protocols 0-2 write bytes from Python 3."""
    if type(text) is not str or encoding not in ("latin1", "latin-1", "latin_1") or errors != "strict":
        raise Refusal("_codecs.encode is called other than as pickle writes bytes (a str and 'latin1')")
    return _latin1(text, "_codecs.encode's text")


def _collection(kind: type):
    def build(items: Any = ()) -> Any:
        if not isinstance(items, (list, tuple, set, frozenset)):
            raise Refusal(f"{kind.__name__}() is called with a {type(items).__name__}, not a list")
        return kind(items)
    build.__name__ = kind.__name__
    return build


def _dtype(spec: Any, align: Any = False, copy: Any = False) -> np.dtype:
    """``numpy.dtype(code, align, copy)``; older NumPy (the CIFAR-10 batches') wrote the flags as 0 and 1."""
    flags = (align, copy)
    if not isinstance(spec, (str, bytes)) or len(spec) > 16 or any(type(f) not in (bool, int) or f not in (0, 1)
                                                                   for f in flags):
        raise Refusal("numpy.dtype is called other than as NumPy pickles a dtype (a short type code and two flags)")
    spec = spec.decode("latin-1") if isinstance(spec, bytes) else spec
    return _plain_dtype(np.dtype(spec, bool(align), bool(copy)), f"dtype {spec!r}")


class _NdarrayName:
    """What ``numpy.ndarray`` resolves to: an argument for ``_reconstruct``, never called
    (``ndarray(shape)`` allocates the shape it is given)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise Refusal("it calls numpy.ndarray directly, which allocates whatever shape it is given")


_NDARRAY = _NdarrayName()


class _PickledArray(np.ndarray):
    """The empty array ``_reconstruct`` makes, whose state is checked before NumPy applies it:
    NumPy allocates an object array's declared shape before it reads the list of items."""

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise Refusal("an array's state is not the tuple NumPy writes")
        shape, dtype, _fortran, raw = state[-4:]
        shape = _shape(shape, "an array's shape")
        dtype = _plain_dtype(dtype, "an array's dtype")
        raw = _latin1(raw, "an array's data")
        _sized(shape, dtype, raw, "an array")
        super().__setstate__((*state[:-1], raw))


def _reconstruct(cls: Any, shape: Any, typecode: Any) -> np.ndarray:
    if cls is not _NDARRAY or shape != (0,) or typecode not in (b"b", "b"):
        raise Refusal("multiarray._reconstruct is called other than as NumPy pickles an array "
                      "(numpy.ndarray, (0,), b'b')")
    return np.ndarray.__new__(_PickledArray, (0,), np.int8)


def _scalar(dtype: Any, obj: Any = None) -> Any:
    dtype = _plain_dtype(dtype, "a scalar's dtype")
    raw = _latin1(obj, "a scalar's data")
    _sized((), dtype, raw, "a scalar")
    return _core("multiarray", "scalar")(dtype, raw)


def _frombuffer(buf: Any, dtype: Any, shape: Any, order: Any) -> np.ndarray:
    if not isinstance(buf, (bytes, bytearray)) or order not in ("C", "F"):
        raise Refusal("numeric._frombuffer is called other than as NumPy pickles an array in band")
    dtype, shape = _plain_dtype(dtype, "an array's dtype"), _shape(shape, "an array's shape")
    _sized(shape, dtype, buf, "an array")
    return np.frombuffer(buf, dtype=dtype).reshape(shape, order=order)


_STAND_INS: dict[tuple[str, str], Any] = {
    ("_codecs", "encode"): _encode, ("builtins", "set"): _collection(set),
    ("builtins", "frozenset"): _collection(frozenset), ("numpy", "ndarray"): _NDARRAY, ("numpy", "dtype"): _dtype,
    **{(f"{core}.multiarray", name): fn for core in ("numpy.core", "numpy._core")
       for name, fn in (("_reconstruct", _reconstruct), ("scalar", _scalar))},
    **{(f"{core}.numeric", "_frombuffer"): _frombuffer for core in ("numpy.core", "numpy._core")},
}
#: (module, name) a dataset pickle may name: sets, bytes as protocols 0-2 write them from Python
#: 3 (_codecs.encode), and what numpy's ndarray/dtype/scalar __reduce__ return, under numpy 1's
#: (numpy.core) and numpy 2's (numpy._core) module names.
ALLOWED = frozenset(_STAND_INS)


def _python3_name(module: str, name: str) -> tuple[str, str]:
    """A Python 2 pickle's name for a global (``__builtin__.set``) as Python 3 finds it (``builtins.set``)."""
    import _compat_pickle

    return _compat_pickle.NAME_MAPPING.get((module, name), (_compat_pickle.IMPORT_MAPPING.get(module, module), name))


def _stand_in(module: str, name: str) -> Any:
    for key in ((module, name), _python3_name(module, name)):
        if key in _STAND_INS:
            return _STAND_INS[key]
    raise Refused(module, name)


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return _stand_in(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise Refusal("it uses persistent ids, which no dataset file does")


def _plain(obj: Any, seen: dict[int, Any]) -> Any:
    """``obj`` with the checked arrays replaced by plain ndarray views (nesting is bounded by the scan)."""
    if id(obj) in seen:
        return seen[id(obj)]
    if isinstance(obj, _PickledArray):
        seen[id(obj)] = out = obj.view(np.ndarray)
    elif isinstance(obj, list):
        seen[id(obj)] = obj
        obj[:] = [_plain(x, seen) if isinstance(x, (list, dict, tuple, np.ndarray)) else x for x in obj]
        out = obj
    elif isinstance(obj, dict):
        seen[id(obj)] = obj
        for k, v in obj.items():
            if isinstance(v, (list, dict, tuple, np.ndarray)):
                obj[k] = _plain(v, seen)
        out = obj
    elif isinstance(obj, tuple):
        seen[id(obj)] = out = tuple(_plain(x, seen) for x in obj)
    else:
        out = obj
    return out


def load(path: str | Path, *, fix: str, encoding: str = "ASCII", max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """The object pickled in ``path``, built only from plain containers, numbers, strings and
    NumPy arrays of numbers; anything else, and any file that cannot be read or unpickled, is a
    one-line :class:`UserError` naming the file (and ``fix``)."""
    from clbench.received import read_bytes

    where = str(path)
    data = read_bytes(path, fix=fix, limit=max_bytes, bound="a file of this dataset can be")
    try:
        scan(data, _stand_in)
        return _plain(_Restricted(io.BytesIO(data), encoding=encoding).load(), {})
    except Refused as err:
        raise UserError(f"refused to unpickle: the file names {err.module}.{err.name}, and {_RULE} "
                        "(unpickling it could run code)", where=where, fix=fix) from None
    except Refusal as err:
        raise UserError(f"refused to unpickle: {err}", where=where, fix=fix) from None
    except Exception as err:  # noqa: BLE001 - whatever a damaged file makes the parser or unpickler raise
        detail = " ".join(str(err).split())
        detail = detail if len(detail) <= 160 else detail[:157] + "..."
        raise UserError(f"not a readable pickle ({type(err).__name__}: {detail})", where=where, fix=fix) from None
