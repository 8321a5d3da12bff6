"""``clbench data check BENCHMARK --root DIR``: verify a dataset's on-disk layout."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("data", help="dataset utilities")
    data_sub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    check = data_sub.add_parser("check", help="verify a dataset's layout and counts, and name what is missing")
    check.add_argument("benchmark", help="benchmark name, e.g. core50, office-home, cifar10-dirichlet")
    check.add_argument("--root", required=True, help="the dataset's root folder")
    check.add_argument("args", nargs="*", metavar="key=value", help="extra benchmark init_args")
    check.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from clbench.datacheck import main

    argv = [args.benchmark, "--root", args.root, *args.args]
    return main(argv)
