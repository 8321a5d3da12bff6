"""``clbench data check BENCHMARK --root DIR``: verify a dataset's on-disk layout."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("data", help="dataset utilities")
    data_sub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    check = data_sub.add_parser("check", help="verify a dataset's layout and counts, and name what is missing")
    check.add_argument("benchmark", help="benchmark name, e.g. core50, office-home, cifar10-dirichlet")
    # Everything after the name goes to the checker's own parser (argparse inside subparsers
    # cannot take key=value pairs after an option).
    check.add_argument("rest", nargs=argparse.REMAINDER, metavar="--root DIR [key=value ...] [options]")
    check.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from clbench.data.check import main

    return main([args.benchmark, *args.rest])
