"""Subcommands of ``clbench``: one module each, exposing ``register(subparsers)`` and ``handle(args)``."""
