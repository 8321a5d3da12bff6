"""``clbench list [strategies|benchmarks|models|objectives] [-v]``: what can be named in a config.

Names, one-line descriptions and, with ``-v``, each component's hyper-parameters (type and
default as its signature writes them). All of it is read from entry-point metadata and the
plugins' source files (:mod:`clbench.plugins.describe`): nothing heavy is imported.
"""

from __future__ import annotations

import argparse

from clbench.registry import KINDS


def register(sub) -> None:
    p = sub.add_parser("list", help="list registered strategies, benchmarks, models and objectives",
                       description="List what a config can name, with a one-line description of each "
                                   "(-v: with every hyper-parameter's type and default).")
    p.add_argument("kind", nargs="?", choices=KINDS, help="one kind only")
    p.add_argument("-v", "--verbose", action="store_true", help="also each component's hyper-parameters")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from clbench.plugins.describe import describe
    from clbench.registry import available

    console = Console()
    for kind in [args.kind] if args.kind else KINDS:
        components = available(kind)
        table = Table(title=kind, title_justify="left", show_edge=False, show_lines=args.verbose)
        table.add_column("name", style="bold", no_wrap=True)
        table.add_column("description")
        if args.verbose:
            table.add_column("hyper-parameters (type = default)")
            width = 0
        else:
            # Rich wraps at spaces and folds a word anywhere: the import path, which has no spaces,
            # is broken after a "." or ":" instead, into lines of the width it is given here.
            width = _target_width(console.width, components)
            table.add_column("defined in", no_wrap=True, width=width)
        for name, target in components.items():
            component = describe(kind, name, target, verbose=args.verbose)
            if args.verbose:
                table.add_row(name, component.summary, "\n".join(_signature_line(p) for p in component.params))
            else:
                table.add_row(name, component.summary, "\n".join(break_path(target, width)))
        console.print(table)
    return 0


DESCRIPTION_MIN = 24  # columns the description keeps before the import path is broken


def _target_width(columns: int, components: dict[str, str]) -> int:
    """The "defined in" column's width: the longest import path where the terminal has room for
    it beside the names and a readable description, else what is left (at least 16)."""
    name = max((len(n) for n in components), default=4)
    longest = max((len(t) for t in components.values()), default=10)
    room = columns - name - DESCRIPTION_MIN - 6  # a space either side of the two column rules
    return max(16, min(longest, room))


def break_path(target: str, width: int) -> list[str]:
    """``target`` (``package.module:name``) in lines of at most ``width`` characters, broken after
    a "." or ":"; a part longer than ``width`` alone is folded."""
    import re

    lines = [""]
    for part in re.findall(r"[^.:]+[.:]?|[.:]", target):
        if lines[-1] and len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
        while len(lines[-1]) > width:
            lines[-1:] = [lines[-1][:width], lines[-1][width:]]
    return lines


def _signature_line(param) -> str:
    from rich.markup import escape

    text = param.name + (f": {param.type}" if param.type else "")
    text += " (required)" if param.required else f" = {param.default}"
    return escape(text)
