"""``clbench show NAME``: one component's description and hyper-parameters.

NAME is a short name from ``clbench list`` (looked up in every kind, or in ``--kind`` only) or
an import path (``my_pkg.module:Class``, ``path/to/file.py:Class``). Read from the source
file without importing it (:mod:`clbench.plugins.describe`).
"""

from __future__ import annotations

import argparse

from clbench.errors import UserError, did_you_mean
from clbench.registry import KINDS, SINGULAR


def register(sub) -> None:
    p = sub.add_parser("show", help="a component's description and hyper-parameters (types, defaults, docs)")
    p.add_argument("name", help="a name from 'clbench list', or an import path such as my_pkg.module:Class")
    p.add_argument("--kind", choices=KINDS, help="where to look up NAME (default: every kind; "
                                                  "for an import path: strategies)")
    p.set_defaults(handler=handle)


def _find(name: str, kind: str | None) -> list[tuple[str, str]]:
    """``[(kind, target)]`` for every kind that knows ``name``."""
    from clbench.registry import looks_like_path, available

    kinds = [kind] if kind else list(KINDS)
    found = [(k, available(k)[name]) for k in kinds if name in available(k)]
    if not found and looks_like_path(name):
        found = [(kind or "strategies", name)]
    if not found:
        known = {n for k in kinds for n in available(k)}
        raise UserError(f"unknown component '{name}'", where="clbench show NAME", fix=did_you_mean(name, known))
    return found


def handle(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.padding import Padding

    from clbench.plugins.describe import describe

    console = Console(highlight=False)
    for kind, target in _find(args.name, args.kind):
        component = describe(kind, args.name, target, verbose=True)
        console.print(f"[bold]{escape(args.name)}[/] ({SINGULAR[kind]}, {escape(target)})")
        if component.summary:
            console.print(Padding(escape(component.summary), (0, 0, 0, 2)))
        if not component.params:
            console.print("  no hyper-parameters")
        for p in component.params:
            kind_text = f": {p.type}" if p.type else ""
            default = "required" if p.required else f"default {p.default}"
            console.print(f"  [bold]{escape(p.name)}[/]{escape(kind_text)} ({escape(default)})")
            if p.doc:
                console.print(Padding(escape(p.doc), (0, 0, 0, 6)))
        console.print()
    return 0
