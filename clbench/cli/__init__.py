"""The ``clbench`` command: :mod:`clbench.cli.main` parses the command line, and each subcommand
lives in its own module here, exposing ``register(subparsers)`` and ``handle(args)``."""


def check_folder(value: str, flag: str) -> None:
    """Refuse an empty folder argument (``--output ''``), which would otherwise mean the current folder."""
    from clbench.errors import UserError

    if not value:
        example = f"{flag} runs/NAME" if flag.startswith("-") else "runs/NAME"
        raise UserError("expected a folder, got an empty string, which would silently mean the current folder",
                        where=flag, fix=f"give a folder (e.g. {example}), or '.' for the current one")
