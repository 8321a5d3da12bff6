"""What a component is and what it takes, read from its source without running it.

``clbench list`` shows a one-line description per component, and ``clbench list -v`` /
``clbench show NAME`` its hyper-parameters (name, type, default, the docstring's line for it).
All of it comes from the plugin's source file through :mod:`ast`: the class or function is
found by name, its docstring's first sentence is the description, its signature (``__init__``
for a class, following base classes defined in the same file) gives names, annotations and
defaults as written, and a Google-style ``Args:`` section gives each parameter's line. Nothing
is imported beyond the plugin's parent packages (to locate the file), so listing stays as fast
as reading entry-point metadata; only a component whose source cannot be read (a compiled or
dynamically built one) is imported and inspected instead.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clbench.plugins.supplied import MODEL_ARGS

# Arguments the harness fills in itself (a model's, from the objective's ``model_args``):
# listing them as hyper-parameters would mislead.
SUPPLIED_BY_HARNESS = {"models": frozenset(MODEL_ARGS)}
_SELF = frozenset({"self", "cls"})
_ROOTS = frozenset({"object", "ABC", "Generic", "Protocol"})
_NO_ARGUMENTS = ast.parse("def __init__(self): pass").body[0]
_ARG_LINE = re.compile(r"^(\*{0,2}[A-Za-z_][A-Za-z0-9_]*)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


@dataclass(frozen=True)
class Param:
    name: str
    type: str | None
    default: str | None  # source text; None: required
    doc: str = ""

    @property
    def required(self) -> bool:
        return self.default is None


@dataclass
class Component:
    name: str
    target: str  # module:attr, or a file path and attr
    summary: str = ""
    params: list[Param] = field(default_factory=list)


def first_sentence(doc: str | None) -> str:
    """The docstring's first sentence (up to the first blank line or '. '), on one line."""
    if not doc:
        return ""
    para = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split()).replace("``", "")
    head, dot, _ = para.partition(". ")
    return head + ("." if dot else "")


def arg_docs(doc: str | None) -> dict[str, str]:
    """``{name: description}`` from a Google-style ``Args:`` section (continuation lines joined)."""
    if not doc:
        return {}
    lines = inspect.cleandoc(doc).splitlines()
    out: dict[str, str] = {}
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() in ("Args:", "Arguments:", "Parameters:"))
    except StopIteration:
        return {}
    current, indent = None, None
    for line in lines[start + 1:]:
        if not line.strip():
            current = None
            continue
        width = len(line) - len(line.lstrip())
        if width == 0:  # the section ended
            break
        match = _ARG_LINE.match(line.strip())
        if match and (indent is None or width <= indent):
            indent = width
            current = match.group(1).lstrip("*")
            out[current] = match.group(2).strip()
        elif current is not None:
            out[current] = f"{out[current]} {line.strip()}".strip()
    return {name: text.replace("``", "") for name, text in out.items()}


_SIGNS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


class _Aliases:
    """A file's module-level ``Name = <annotation>`` assignments (``Positive = Annotated[int,
    Field(ge=1)]``) and ``TypedDict`` classes, and those it imports from another file (``from
    clbench.benchmarks.images import ImageSize``), read from that file when first asked for."""

    def __init__(self, tree: ast.Module | None, depth: int = 0):
        self.tree, self.depth, self.names = tree, depth, {}
        for node in tree.body if tree is not None else ():
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.names[node.targets[0].id] = node.value
            elif isinstance(node, ast.ClassDef) and any(ast.unparse(b) == "TypedDict" for b in node.bases):
                self.names[node.name] = node

    def get(self, name: str) -> tuple[ast.AST, _Aliases] | None:
        """What ``name`` stands for, and the aliases of the file it is written in."""
        if name in self.names:
            return self.names[name], self
        target = _imported_from(self.tree, name) if self.tree is not None and self.depth < 4 else None
        if target is None:
            return None
        path, attr = _source_file(target)
        tree = _parse(path) if path is not None and path.is_file() else None
        return _Aliases(tree, self.depth + 1).get(attr) if tree is not None else None


def _aliases(tree: ast.Module | None) -> _Aliases:
    return _Aliases(tree)


def readable(node: ast.expr, aliases: _Aliases | None = None, depth: int = 0) -> str:
    """An annotation as a reader wants it: aliases defined in the file (or imported into it)
    expanded, ``Annotated[int, Field(ge=1)]`` as ``int >= 1`` (``float in [0, 1]`` for both
    bounds), a ``TypedDict`` as ``mapping of its keys``; anything else as written."""
    aliases = aliases or _Aliases(None)
    again = (lambda n: readable(n, aliases, depth + 1))
    if depth > 8:
        return ast.unparse(node)
    found = aliases.get(node.id) if isinstance(node, ast.Name) else None
    if found is not None and isinstance(found[0], (ast.Subscript, ast.BinOp)):
        return readable(found[0], found[1], depth + 1)
    if found is not None and isinstance(found[0], ast.ClassDef):
        keys = [s.target.id for s in found[0].body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
        return f"mapping of {', '.join(keys)}"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return f"{again(node.left)} | {again(node.right)}"
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if node.value.id == "Annotated" and len(items) >= 2:
            bounds = {k.arg: k.value.value for meta in items[1:] if isinstance(meta, ast.Call)
                      for k in meta.keywords if k.arg in _SIGNS and isinstance(k.value, ast.Constant)}
            base = again(items[0])
            low = [k for k in ("ge", "gt") if k in bounds]
            high = [k for k in ("le", "lt") if k in bounds]
            if low and high:
                return (f"{base} in {'[' if low[0] == 'ge' else '('}{bounds[low[0]]}, "
                        f"{bounds[high[0]]}{']' if high[0] == 'le' else ')'}")
            return " ".join([base, *(f"{_SIGNS[k]} {bounds[k]}" for k in low + high)])
        if node.value.id == "Literal":
            named = aliases.get(items[0].id) if len(items) == 1 and isinstance(items[0], ast.Name) else None
            if named is not None and isinstance(named[0], ast.Tuple):  # Literal[TASKS], TASKS a tuple of names
                return f"Literal[{', '.join(ast.unparse(e) for e in named[0].elts)}]"
            return ast.unparse(node)
        return f"{node.value.id}[{', '.join(again(i) for i in items)}]"
    return ast.unparse(node)


def _params_from_ast(func: ast.FunctionDef, docs: dict[str, str], skip: frozenset[str],
                     aliases: dict[str, ast.expr] | None = None) -> list[Param]:
    args = func.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    pairs = list(zip(positional, defaults)) + list(zip(args.kwonlyargs, args.kw_defaults))
    out = []
    for arg, default in pairs:
        if arg.arg in skip:
            continue
        out.append(Param(arg.arg, readable(arg.annotation, aliases) if arg.annotation is not None else None,
                         ast.unparse(default) if default is not None else None, docs.get(arg.arg, "")))
    return out


def _find(tree: ast.Module, name: str) -> ast.ClassDef | ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            return node
    return None


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


def _imported_from(tree: ast.Module, name: str) -> str | None:
    """``module:attr`` for a name the module imports with ``from module import attr [as name]``."""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return f"{node.module}:{alias.name}"
    return None


def _defined_at(target: str) -> str:
    """Where a lazily re-exported name is defined: ``from clbench import Strategy`` is read in
    :mod:`clbench.strategy` (the package's ``__init__`` has only the lazy table, and importing
    the name itself would import torch)."""
    module, _, attr = target.partition(":")
    if module == "clbench":
        import clbench

        lazy = clbench._LAZY.get(attr)
        if lazy is not None:
            module, attr = lazy if isinstance(lazy, tuple) else (lazy, attr)
    return f"{module}:{attr}"


def _init_of(tree: ast.Module, cls: ast.ClassDef, depth: int = 0) -> tuple[ast.FunctionDef | None, str | None]:
    """The ``__init__`` a class runs and the docstring of the class that defines it, following
    base classes through this file and the files they are imported from. (None, None) when it
    cannot be found in source."""
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            return node, ast.get_docstring(cls)
    if not [b for b in cls.bases if not (isinstance(b, ast.Name) and b.id in _ROOTS)]:
        return _NO_ARGUMENTS, None  # object's __init__: nothing to configure
    if depth > 8:
        return None, None
    for base in cls.bases:
        if not isinstance(base, ast.Name):
            continue
        parent_tree, parent = tree, _find(tree, base.id)
        if parent is None and (target := _imported_from(tree, base.id)):
            path, attr = _source_file(_defined_at(target))
            parent_tree = _parse(path) if path is not None else None
            parent = _find(parent_tree, attr) if parent_tree is not None else None
        if isinstance(parent, ast.ClassDef):
            return _init_of(parent_tree, parent, depth + 1)
    return None, None


def _source_file(target: str) -> tuple[Path | None, str]:
    module_part, _, attr = target.rpartition(":") if ":" in target else target.rpartition(".")
    if module_part.endswith(".py"):
        return Path(module_part), attr
    # Each package is followed on disk where it can be (finding a submodule through the import
    # system runs every parent package's __init__, and some of those import torch); a package
    # installed under another folder (an editable install maps clbench.strategies to the
    # repository's clbench/strategies/) is located by the import system, its parents being imported then.
    parts = module_part.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return None, attr
    if spec is None:
        return None, attr
    if len(parts) == 1:
        return (Path(spec.origin) if spec.has_location and (spec.origin or "").endswith(".py") else None), attr
    locations = list(spec.submodule_search_locations or ())
    for depth, part in enumerate(parts[1:], start=2):
        last = depth == len(parts)
        found = None
        for root in locations:
            base = Path(root) / part
            if last and base.with_suffix(".py").is_file():
                return base.with_suffix(".py"), attr
            if (base / "__init__.py").is_file():
                found = base
                break
        if found is None:
            try:
                spec = importlib.util.find_spec(".".join(parts[:depth]))
            except (ImportError, ValueError):
                return None, attr
            if spec is None:
                return None, attr
            if last or not spec.submodule_search_locations:
                origin = spec.origin if spec.has_location else None
                return (Path(origin) if last and origin and origin.endswith(".py") else None), attr
            locations = list(spec.submodule_search_locations)
        elif last:
            return found / "__init__.py", attr
        else:
            locations = [str(found)]
    return None, attr


def _from_source(name: str, target: str, verbose: bool, skip: frozenset[str]) -> Component | None:
    path, attr = _source_file(target)
    if path is None or not path.is_file():
        return None
    tree = _parse(path)
    node = _find(tree, attr) if tree is not None else None
    if node is None:
        return None
    doc = ast.get_docstring(node)
    component = Component(name, target, first_sentence(doc))
    if not verbose:
        return component
    if isinstance(node, ast.FunctionDef):
        component.params = _params_from_ast(node, arg_docs(doc), skip, _aliases(tree))
        return component
    init, init_doc = _init_of(tree, node)
    if init is None:
        return None  # inherited from another module: let inspection find it
    docs = {**arg_docs(init_doc), **arg_docs(ast.get_docstring(init)), **arg_docs(doc)}
    component.params = _params_from_ast(init, docs, skip, _aliases(tree))
    return component


def _from_object(name: str, target: str, obj: Any, skip: frozenset[str]) -> Component:
    doc = inspect.getdoc(obj)
    component = Component(name, target, first_sentence(doc))
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return component
    docs = {**arg_docs(inspect.getdoc(getattr(obj, "__init__", None))), **arg_docs(doc)}
    for p in signature.parameters.values():
        if p.name in skip or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        annotation = None if p.annotation is p.empty else (
            p.annotation if isinstance(p.annotation, str) else inspect.formatannotation(p.annotation))
        default = None if p.default is p.empty else repr(p.default)
        component.params.append(Param(p.name, annotation, default, docs.get(p.name, "")))
    return component


def describe(kind: str, name: str, target: str, *, verbose: bool = False) -> Component:
    """``name``'s description (and, with ``verbose``, its hyper-parameters)."""
    skip = _SELF | SUPPLIED_BY_HARNESS.get(kind, frozenset())
    found = _from_source(name, target, verbose, skip)
    if found is not None:
        return found
    from clbench.registry import resolve

    return _from_object(name, target, resolve(kind, name), skip)

