"""``clbench list [strategies|benchmarks|models]``: what can be named in a config.

Reads entry-point metadata only; nothing heavy is imported.
"""

from __future__ import annotations

import argparse

from clbench.registry import KINDS


def register(sub) -> None:
    p = sub.add_parser("list", help="list registered strategies, benchmarks and models")
    p.add_argument("kind", nargs="?", choices=KINDS, help="one kind only")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from clbench.registry import available

    console = Console()
    for kind in [args.kind] if args.kind else KINDS:
        table = Table(title=kind, title_justify="left", show_edge=False)
        table.add_column("name", style="bold")
        table.add_column("defined in")
        for name, target in available(kind).items():
            table.add_row(name, target)
        console.print(table)
    return 0
