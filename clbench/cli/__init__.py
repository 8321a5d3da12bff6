"""The ``clbench`` command: :mod:`clbench.cli.main` parses the command line, and each subcommand
lives in its own module here, exposing ``register(subparsers)`` and ``handle(args)``."""
