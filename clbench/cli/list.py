"""``clbench list [strategies|benchmarks|models|objectives] [-v]``: what can be named in a config.

Names, one-line descriptions and, with ``-v``, each component's hyper-parameters (type and
default as its signature writes them). All of it is read from entry-point metadata and the
plugins' source files (:mod:`clbench.plugins.describe`): nothing heavy is imported.
"""

from __future__ import annotations

import argparse

from clbench.plugins.registry import KINDS


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
    from clbench.plugins.registry import available

    console = Console()
    for kind in [args.kind] if args.kind else KINDS:
        table = Table(title=kind, title_justify="left", show_edge=False, show_lines=args.verbose)
        table.add_column("name", style="bold", no_wrap=True)
        table.add_column("description")
        if args.verbose:
            table.add_column("hyper-parameters (type = default)")
        else:
            table.add_column("defined in", overflow="fold")
        for name, target in available(kind).items():
            component = describe(kind, name, target, verbose=args.verbose)
            if args.verbose:
                table.add_row(name, component.summary, "\n".join(_signature_line(p) for p in component.params))
            else:
                table.add_row(name, component.summary, target)
        console.print(table)
    return 0


def _signature_line(param) -> str:
    from rich.markup import escape

    text = param.name + (f": {param.type}" if param.type else "")
    text += " (required)" if param.required else f" = {param.default}"
    return escape(text)
