"""No plugin checks one of its arguments by hand: ranges, allowed values and types are declared in
the signature and checked by clbench.config.validation; what a signature cannot say is refused through
clbench.config.validation.ArgumentError, which words the field path in one place.

The scan reads the source (ast), so it holds for every plugin file, tested or not. It flags:

* an ``if`` that raises and whose condition reads exactly one argument of the enclosing function
  (or a loop variable over it) and nothing but constants and builtins: ``if mem_size < 0``,
  ``if policy not in ("a", "b")``, ``if not isinstance(n, int) or n < 1``;
* a hand-written config path: a string (not a docstring) naming a component's ``init_args``,
  as in ``where="strategy.init_args.top_k"`` or ``WHERE = "model.init_args"``.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("strategies", "benchmarks", "models", "objectives")


def _module_file(name: str) -> Path | None:
    """The source file of module ``name``, found without importing it."""
    spec = importlib.util.find_spec(name)
    return Path(spec.origin) if spec is not None and spec.origin else None


def _plugin_files() -> list[Path]:
    """Every file that defines a registered strategy, benchmark, model factory or objective, the
    other files of the built-in strategies' and benchmarks' folders (their shared helpers), and
    the GGUF weights' module (the causal LM's paths). The layers the factories assemble
    (clbench.models.layers, the ViT-MoE's routers) keep their ValueError preconditions, as
    torch's own layers do: a factory's signature is where a config's value is checked."""
    from clbench import registry

    files = {_module_file(target.split(":")[0]) for kind in KINDS for target in registry.available(kind).values()}
    for folder in ("strategies", "benchmarks"):
        files |= set((ROOT / "clbench" / folder).glob("*.py"))
    files.add(_module_file("clbench.models.lm.gguf"))
    return sorted({path.resolve() for path in files if path is not None and path.resolve().is_relative_to(ROOT)})


PLUGIN_FILES = _plugin_files()
# The checks of one value that stay, and why no signature can hold them.
KEPT = {
    "architecture not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES":
        "transformers' model types are known only once transformers is imported, which a config check avoids",
    "name not in PRESETS":
        "the NAME of `clbench models fetch NAME`, a command-line argument, not an init_args value",
    "not isinstance(raw, (list, tuple))":
        "the labels read from a received CIFAR-10 batch file, not a config value: no signature holds a file's contents",
}
# Calls a pure value check may make (anything else, such as path.exists(), reads the world).
PURE_CALLS = {"isinstance", "len", "int", "float", "bool", "str", "type", "all", "any", "set", "sorted", "list",
              "tuple", "min", "max", "abs", "round", "sum"}
BUILTIN_NAMES = set(dir(builtins))
CONFIG_PATH = re.compile(r"\b(benchmark|model|strategy|objective)\.init_args\b")


def _is_constant_name(name: str) -> bool:
    return name.isupper() or name in BUILTIN_NAMES  # module constants (TASKS, DTYPES) and builtins


def _pure_names(node: ast.AST) -> set[str] | None:
    """The names ``node`` reads, or None if it does more than compare values (calls a method,
    indexes, reads an attribute of something)."""
    bound = {t.id for comp in ast.walk(node) if isinstance(comp, ast.comprehension)
             for t in ast.walk(comp.target) if isinstance(t, ast.Name)}
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            if not (isinstance(sub.func, ast.Name) and sub.func.id in PURE_CALLS):
                return None
        elif isinstance(sub, (ast.Attribute, ast.Subscript, ast.Await, ast.NamedExpr, ast.Lambda)):
            return None
        elif isinstance(sub, ast.Name) and sub.id not in bound:
            names.add(sub.id)
    return names


def _raises(body: list[ast.stmt]) -> bool:
    return any(isinstance(stmt, ast.Raise) for stmt in body)


def _arguments(func: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    args = func.args
    return {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]} - {"self", "cls"}


def single_argument_checks(source: str) -> list[str]:
    """``line: condition`` of every hand-written check of one argument's value in ``source``."""
    found = []
    for func in ast.walk(ast.parse(source)):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = _arguments(func)
        aliases = {}  # loop variable -> the argument it walks over
        for loop in ast.walk(func):
            if isinstance(loop, ast.For) and isinstance(loop.target, ast.Name) and isinstance(loop.iter, ast.Name) \
                    and loop.iter.id in params:
                aliases[loop.target.id] = loop.iter.id
        for node in ast.walk(func):
            if not (isinstance(node, ast.If) and _raises(node.body)):
                continue
            names = _pure_names(node.test)
            if names is None:
                continue
            read = {aliases.get(n, n) for n in names if n in params or n in aliases}
            others = {n for n in names if n not in params and n not in aliases}
            if len(read) == 1 and all(_is_constant_name(n) for n in others):
                found.append(f"{node.lineno}: if {ast.unparse(node.test)}")
    return found


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and (body := node.body) and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)}


def handwritten_paths(source: str) -> list[str]:
    """``line: text`` of every string in ``source`` (docstrings aside) that spells a component's
    config path (``model.init_args``)."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if CONFIG_PATH.search(node.value):
                found.append(f"{node.lineno}: {node.value!r}")
    return found


def _condition(found: str) -> str:
    return found.split(": if ", 1)[1]


def test_every_kept_check_is_still_there():
    found = {_condition(c) for path in PLUGIN_FILES for c in single_argument_checks(path.read_text())}
    assert all(why for why in KEPT.values()) and set(KEPT) <= found


def test_the_scan_covers_the_plugin_files():
    assert len(PLUGIN_FILES) >= 30 and all(path.is_file() for path in PLUGIN_FILES)
    assert {"replay.py", "core50.py", "images.py", "vit_moe.py", "classification.py"} \
        <= {path.name for path in PLUGIN_FILES}


@pytest.mark.parametrize("path", PLUGIN_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_plugin_checks_an_argument_by_hand(path):
    source = path.read_text(encoding="utf-8")
    assert [c for c in single_argument_checks(source) if _condition(c) not in KEPT] == [], \
        "declare the range in the signature (Annotated[int, Field(ge=1)], Literal[...]) instead"
    assert handwritten_paths(source) == [], "refuse through clbench.config.validation.ArgumentError(component, field, ...)"


@pytest.mark.parametrize("check", [
    "if mem_size < 0:\n    raise UserError('x')",
    "if not 0.0 < test_fraction < 1.0:\n    raise UserError('x')",
    "if policy not in ('reservoir', 'class_balanced'):\n    raise UserError('x')",
    "if not isinstance(n, int) or isinstance(n, bool) or n < 1:\n    raise ValueError('x')",
    "if mem_size is not None and mem_size < 1:\n    raise UserError('x')",
    "for name in domains:\n    if name not in DOMAINS:\n        raise UserError('x')",
    "if not domains or any(not isinstance(d, str) for d in domains):\n    raise UserError('x')",
])
def test_the_scan_finds_a_single_argument_check(check):
    source = f"def plugin(mem_size=1, test_fraction=0.2, policy='x', n=1, domains=None):\n" \
             f"{textwrap.indent(check, '    ')}\n"
    assert len(single_argument_checks(source)) == 1


@pytest.mark.parametrize("check", [
    "if top_k > num_experts:\n    raise UserError('x')",  # two arguments: a cross-argument check
    "if not Path(root).exists():\n    raise UserError('x')",  # the disk, not the value
    "if len(labels) < n_test:\n    raise UserError('x')",  # data against an argument
    "if mem_size < 0:\n    mem_size = 0",  # no refusal
])
def test_the_scan_leaves_other_checks(check):
    source = f"def plugin(top_k=1, num_experts=2, root='.', n_test=1, mem_size=1):\n" \
             f"    labels = []\n{textwrap.indent(check, '    ')}\n"
    assert single_argument_checks(source) == []


def test_the_scan_finds_a_handwritten_path():
    assert len(handwritten_paths('def f(x):\n    """strategy.init_args.x is documented"""\n'
                                 '    raise UserError("bad", where="strategy.init_args.x")\n')) == 1
    assert len(handwritten_paths('WHERE = "model.init_args"\n')) == 1
    assert handwritten_paths('FIX = "write {class_path: x, init_args: {...}}"\n') == []
    assert handwritten_paths('def f(where):\n    check(f"{where}.init_args")\n') == []  # a nested plugin's
