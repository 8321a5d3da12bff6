"""The package's shape: its modules import each other without cycles and only downward through
the floors of ``clbench.LAYERS``, and none is long without a stated reason.

Both read the source with ``ast``, so they are fast and see every import: at module level,
under ``TYPE_CHECKING`` and inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]

# Import edges that close a known cycle, each with why it is tolerated (none: the hooks' type
# hints on the LightningModule, the last two, went with the plugin API's context).
KNOWN_CYCLE_EDGES: dict[tuple[str, str], str] = {}

MAX_LINES = 400
# Modules allowed over MAX_LINES, each with why it stays one module.
LONG_MODULES: dict[str, str] = {}


def _modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "clbench").rglob("*.py"):
        parts = ["clbench", *path.relative_to(ROOT / "clbench").with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _lazy_names(path: Path) -> dict[str, str]:
    """A package's names that load on first access (``_LAZY`` / ``_EXPORTS`` in its
    ``__init__``): name -> the module that defines it."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id in ("_LAZY", "_EXPORTS") and node.value is not None:
            for name, where in ast.literal_eval(node.value).items():
                found[name] = where if isinstance(where, str) else where[0]
    return found


def import_graph() -> nx.DiGraph:
    """Module -> module it imports, over clbench's own modules. ``from a.b import c`` is an
    edge to ``a.b.c`` when that is a module, else to ``a.b``, and also to the module ``c``
    loads from when ``a.b`` exports it lazily (``from clbench import Strategy``)."""
    modules = _modules()
    lazy = {name: _lazy_names(path) for name, path in modules.items() if path.name == "__init__.py"}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                for alias in node.names:
                    targets.append(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
                    if alias.name in lazy.get(base, {}):
                        targets.append(lazy[base][alias.name])
            graph.add_edges_from((name, t) for t in targets if t in modules and t != name)
    return graph


def test_the_import_graph_sees_imports_in_functions_and_type_checking_blocks():
    graph = import_graph()
    assert graph.has_edge("clbench.engine.runner", "clbench.engine.faults")  # inside a method
    assert graph.has_edge("clbench.strategy", "clbench.data.streams")  # under TYPE_CHECKING
    assert graph.has_edge("clbench.strategies.replay", "clbench.strategy")  # a lazy export


def test_no_import_cycles_beyond_the_known_ones():
    graph = import_graph()
    for edge, why in KNOWN_CYCLE_EDGES.items():
        assert graph.has_edge(*edge), f"{edge} is gone ({why}): remove it from KNOWN_CYCLE_EDGES"
        assert nx.has_path(graph, edge[1], edge[0]), f"{edge} no longer closes a cycle: remove it from the list"
    graph.remove_edges_from(KNOWN_CYCLE_EDGES)
    cycles = sorted(" -> ".join([*c, c[0]]) for c in nx.simple_cycles(graph))
    assert not cycles, "import cycles (move what both sides need to where it belongs):\n" + "\n".join(cycles[:20])


def test_no_module_is_long_without_a_stated_reason():
    lengths = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    long = {name: n for name, n in lengths.items() if n > MAX_LINES and name not in LONG_MODULES}
    assert not long, (f"modules over {MAX_LINES} lines (split them along a real seam, or give the reason in "
                      f"LONG_MODULES): {long}")
    assert set(LONG_MODULES) <= set(lengths), set(LONG_MODULES) - set(lengths)


def test_models_report_through_their_channels_and_import_no_metrics():
    """Models report routing through ``clbench.models.routing_channel`` and auxiliary losses through
    ``clbench.models.auxiliary``; metrics listen. An import the other way would tie every model
    to the recording code (and once made models and metrics import each other)."""
    graph = import_graph()
    edges = sorted((a, b) for a, b in graph.edges if a.startswith("clbench.models") and b.startswith("clbench.metrics"))
    assert not edges, edges


def _layer_of(module: str) -> int | None:
    from clbench import LAYERS

    for level, members in enumerate(LAYERS):
        if any(module == m or module.startswith(m + ".") for m in members):
            return level
    return None


def test_every_module_has_a_floor_and_imports_downward_but_for_the_named_exceptions():
    """clbench's rooms in floors (``clbench.LAYERS``, bottom first): a module imports its own floor
    and those below. Each import upward is named in ``clbench.UPWARD_IMPORTS`` with its reason, and
    there are at most two of them."""
    from clbench import LAYERS, UPWARD_IMPORTS

    graph = import_graph()
    homeless = sorted(m for m in graph if m != "clbench" and _layer_of(m) is None)
    assert not homeless, f"modules on no floor of clbench.LAYERS: {homeless}"
    upward = sorted((a, b) for a, b in graph.edges if "clbench" not in (a, b) and _layer_of(b) > _layer_of(a))
    assert len(UPWARD_IMPORTS) <= 2
    assert set(upward) == set(UPWARD_IMPORTS), (
        "imports from a lower floor to a higher one (move what is shared down, or name the edge and its reason "
        f"in clbench.UPWARD_IMPORTS): {sorted(set(upward) - set(UPWARD_IMPORTS))}; named but gone: "
        f"{sorted(set(UPWARD_IMPORTS) - set(upward))}")
    assert all(len(floor) == len(set(floor)) for floor in LAYERS)
