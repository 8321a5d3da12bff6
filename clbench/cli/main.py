"""The ``clbench`` command.

Each subcommand lives in its own module under :mod:`clbench.cli` with ``register(sub)``
(adds its parser) and ``handle(args) -> int``. Importing them is cheap: nothing heavy is
imported until a handler runs, so ``clbench --help`` and ``clbench list`` start fast.

Bad input (:class:`~clbench.errors.UserError`, or a command-line usage mistake) is printed as
one line and exits with status 2, without a traceback; so is a write that fails on a full,
read-only or forbidden disk anywhere (:func:`~clbench.errors.unwritable`), naming the path.
A subcommand whose module is not part of this installation is left out of the parser rather
than breaking every other command.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from clbench import __version__
from clbench.errors import exit_status

COMMANDS = ("run", "list", "show", "leaderboard", "compare", "data", "models")


class _Parser(argparse.ArgumentParser):
    """Usage mistakes are bad input too: one line, exit status 2 (subcommands inherit this)."""

    intermixed = False  # set on a command whose positionals may sit among its options
    _parsing = False

    def error(self, message: str):
        self.exit(2, f"clbench: error: {self.prog}: {message} (see '{self.prog} --help')\n")

    def parse_known_args(self, args=None, namespace=None):
        """With ``intermixed``, argparse's intermixed parsing: ``run -c X train.epochs=1 -o Y``
        reads the override before ``-o`` too (plain parsing gives a ``*`` positional its empty
        match before the first option and then calls the override unrecognized)."""
        if not self.intermixed or self._parsing:
            return super().parse_known_args(args, namespace)
        self._parsing = True  # the intermixed parse calls this method for its two passes
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._parsing = False


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="clbench", description="Continual-learning benchmark harness: run streams, strategies and leaderboards.")
    parser.add_argument("--version", action="version", version=f"clbench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"clbench.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from clbench.quiet import route_dependency_warnings

    route_dependency_warnings()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 0
    return exit_status(lambda: args.handler(args),
                       "clbench: interrupted (finished experiences are checkpointed: 'clbench run --resume' "
                       "or rerunning the suite continues)")


if __name__ == "__main__":
    sys.exit(main())
