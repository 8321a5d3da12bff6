"""The opcode scan :mod:`clbench.data.safe_pickle` runs before it unpickles anything.

:func:`scan` reads a pickle's opcodes with :func:`pickletools.genops`, which only parses
(nothing is built or called), and replays the unpickler's stack with a stand-in per item, to
refuse, before any object exists: a global that ``check_global`` refuses, persistent ids, the
extension registry and out-of-band buffers (no dataset file uses them), memo entries stored
out of order (the unpickler sizes its memo by the largest index, so one opcode could ask for
gigabytes), more objects than a file of its size holds (an empty set takes 1 byte in the file
and over 200 in memory), and objects nested deeper than :data:`MAX_DEPTH` or in a cycle
(hashing a tuple nested a million deep, as building a frozenset or a dict key does, overflows
the C stack: a crash, not an exception). Opcodes whose lengths run past the end of the file
are refused by ``genops`` itself (a ``ValueError``), before the unpickler preallocates them.
"""

from __future__ import annotations

import io
import pickletools
import sys
from typing import Any, Callable

#: Deeper nesting than any dataset file has (a CIFAR-10 batch nests 6 deep), far below what
#: recursive hashing, comparison or repr can take.
MAX_DEPTH = 100
#: The objects a pickle may build, in estimated bytes: this many times the file's size, plus
#: a floor for small files.
OBJECTS_PER_FILE_BYTE, OBJECTS_FLOOR = 8, 64 << 20
_CONTAINER_BYTES = 256  # an upper bound for one empty container or call result
_TOO_DEEP = (f"its objects nest more than {MAX_DEPTH} deep, where a dataset file nests a few levels (unpickling it "
             "could crash Python)")


class Refusal(Exception):
    """Why a pickle is refused (one clause, for the reader's one-line error)."""


_REFUSED_OPS = {"PERSID": "persistent ids", "BINPERSID": "persistent ids", "EXT1": "the extension registry",
                "EXT2": "the extension registry", "EXT4": "the extension registry",
                "NEXT_BUFFER": "out-of-band buffers", "READONLY_BUFFER": "out-of-band buffers"}
_NEW_CONTAINER = {"EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET"}
_FROM_MARK = {"LIST", "TUPLE", "DICT", "FROZENSET", "OBJ", "INST"}
_FROM_TOP = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3, "REDUCE": 2, "NEWOBJ": 2, "NEWOBJ_EX": 3}
_INTO_TOP = {"APPEND": 1, "SETITEM": 2, "BUILD": 1}
_INTO_BELOW_MARK = {"APPENDS", "SETITEMS", "ADDITEMS"}
_ATOMS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "STRING", "BINSTRING", "SHORT_BINSTRING",
          "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8", "NONE", "NEWTRUE", "NEWFALSE", "UNICODE",
          "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "FLOAT", "BINFLOAT", "EMPTY_TUPLE"}
_KIND = {**dict.fromkeys(_ATOMS, "atom"), **dict.fromkeys(("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"), "put"),
         **dict.fromkeys(("GET", "BINGET", "LONG_BINGET"), "get"), **dict.fromkeys(_NEW_CONTAINER, "new"),
         **dict.fromkeys(_FROM_MARK, "from_mark"), **dict.fromkeys(_FROM_TOP, "from_top"),
         **dict.fromkeys(_INTO_TOP, "into_top"), **dict.fromkeys(_INTO_BELOW_MARK, "into_below_mark")}


_UNSET = object()


class _Scan:
    """The unpickler's stack, replayed on the opcodes with a stand-in per item: None for a value
    that holds nothing, a str for a short string (a STACK_GLOBAL's names), an int for a node of
    the graph of what holds what (containers and call results)."""

    def __init__(self, size: int, check_global: Callable[[str, str], Any]):
        self.check_global = check_global
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: list[Any] = []  # as the unpickler's: index -> item, _UNSET where none was stored
        self.stored = 0
        self.children: list[list[int]] = []
        self.depth: list[int] = []  # a lower bound per node, to refuse deep nesting early
        self.budget = OBJECTS_PER_FILE_BYTE * size + OBJECTS_FLOOR

    def spend(self, nbytes: int) -> None:
        self.budget -= nbytes
        if self.budget < 0:
            raise Refusal("it builds far more objects than a file of its size holds")

    def push(self, item: Any) -> None:
        self.spend(8)
        self.stack.append(item)

    def node(self, held: list[Any]) -> int:
        self.spend(_CONTAINER_BYTES)
        kids = [h for h in held if type(h) is int]
        self.children.append(kids)
        self.depth.append(0)
        self.deepen(len(self.children) - 1, kids)
        return len(self.children) - 1

    def deepen(self, node: int, kids: list[int]) -> None:
        if kids:
            self.depth[node] = max(self.depth[node], 1 + max(self.depth[k] for k in kids))
            if self.depth[node] > MAX_DEPTH:
                raise Refusal(_TOO_DEEP)

    def fence(self) -> int:
        return self.marks[-1] if self.marks else 0

    def pop(self, n: int = 1) -> list[Any]:
        if len(self.stack) - n < self.fence():
            raise Refusal("its opcodes take more from the stack than they put there (a damaged file)")
        items = self.stack[len(self.stack) - n:]
        del self.stack[len(self.stack) - n:]
        return items

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            raise Refusal("its opcodes close a MARK that was never opened (a damaged file)")
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def top(self) -> Any:
        if len(self.stack) <= self.fence():
            raise Refusal("its opcodes use an empty stack (a damaged file)")
        return self.stack[-1]

    def hold(self, container: Any, items: list[Any]) -> None:
        if type(container) is int:
            kids = [i for i in items if type(i) is int]
            self.children[container].extend(kids)
            self.deepen(container, kids)

    def step(self, name: str, arg: Any) -> None:
        kind = _KIND.get(name)
        if kind == "atom":
            self.spend(8 + sys.getsizeof(arg))
            self.stack.append(arg if type(arg) is str and len(arg) <= 100 else None)
        elif kind == "put":
            index = self.stored if name == "MEMOIZE" else arg  # the unpickler's MEMOIZE: its count of entries
            if not 0 <= index <= len(self.memo) + 1:  # Python 2's cPickle numbers from 1
                raise Refusal(f"it stores memo entry {index} with {self.stored} stored (picklers number them in order)")
            self.spend(16)
            self.memo.extend([_UNSET] * (index + 1 - len(self.memo)))
            self.stored += self.memo[index] is _UNSET
            self.memo[index] = self.top()
        elif kind == "get":
            if not 0 <= arg < len(self.memo) or self.memo[arg] is _UNSET:
                raise Refusal(f"it reads memo entry {arg}, which was never stored (a damaged file)")
            self.push(self.memo[arg])
        elif kind == "into_top":
            items = self.pop(_INTO_TOP[name])
            self.hold(self.top(), items)
        elif kind == "into_below_mark":
            items = self.pop_mark()
            self.hold(self.top(), items)
        elif name == "MARK":
            self.marks.append(len(self.stack))
        elif kind == "new":
            self.push(self.node([]))
        elif kind == "from_mark":
            if name == "INST":
                module, _, attr = str(arg).partition(" ")
                self.check_global(module, attr)
            self.push(self.node(self.pop_mark()))
        elif kind == "from_top":
            self.push(self.node(self.pop(_FROM_TOP[name])))
        elif name == "GLOBAL":
            module, _, attr = str(arg).partition(" ")
            self.check_global(module, attr)
            self.push(None)
        elif name == "STACK_GLOBAL":
            module, attr = self.pop(2)
            if not (isinstance(module, str) and isinstance(attr, str)):
                raise Refusal("it names a global through values that are not short strings")
            self.check_global(module, attr)
            self.push(None)
        elif name == "POP":
            if self.marks and self.marks[-1] == len(self.stack):
                self.marks.pop()
            else:
                self.pop()
        elif name == "POP_MARK":
            self.pop_mark()
        elif name == "DUP":
            self.push(self.top())
        elif name == "STOP":
            self.pop()
        elif name in _REFUSED_OPS:
            raise Refusal(f"it uses {_REFUSED_OPS[name]}, which no dataset file does")
        elif name not in ("PROTO", "FRAME"):
            raise Refusal(f"it uses the opcode {name}, which this reader does not know")

    def check_depth(self) -> None:
        """Refuse a cycle, or a chain of containers longer than :data:`MAX_DEPTH`: over every
        node ever built, as the unpickler hashes what it builds when it builds it."""
        depth = [0] * len(self.children)
        state = bytearray(len(self.children))  # 0: not seen, 1: on the path, 2: done
        for root in range(len(self.children)):
            if state[root]:
                continue
            path = [(root, 0)]
            state[root] = 1
            while path:
                node, i = path[-1]
                kids = self.children[node]
                if i < len(kids):
                    path[-1] = (node, i + 1)
                    kid = kids[i]
                    if state[kid] == 1:
                        raise Refusal("an object holds itself (a cycle), which no dataset file does")
                    if state[kid] == 0:
                        state[kid] = 1
                        path.append((kid, 0))
                    continue
                depth[node] = 1 + max((depth[k] for k in kids), default=0)
                if depth[node] > MAX_DEPTH:
                    raise Refusal(_TOO_DEEP)
                state[node] = 2
                path.pop()


def scan(data: bytes, check_global: Callable[[str, str], Any]) -> None:
    """Raise :class:`Refusal` (or what ``check_global`` raises for a global it refuses), or
    ``ValueError`` for opcodes that do not parse, if ``data`` should not be unpickled."""
    walk = _Scan(len(data), check_global)
    for opcode, arg, pos in pickletools.genops(io.BytesIO(data)):
        if opcode.name == "FRAME" and arg > len(data) - pos:
            raise Refusal(f"a frame declares {arg} bytes, more than the file has left (a damaged file)")
        walk.step(opcode.name, arg)
    walk.check_depth()
