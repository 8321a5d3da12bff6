"""What a leaderboard folder holds, by kind: a received folder whose ``README.md`` is a folder or
whose ``entries`` is a file is refused as one line naming it, before anything is read or written
(instead of an ``IsADirectoryError`` from the atomic rename of the page, or "no entries/ folder")."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from clbench.errors import UserError

#: Folders of a leaderboard, and what each keeps.
FOLDERS = {"entries": "one JSON entry per run", "pages": "each table row's page",
           "runs": "the working folders of runs in progress"}
#: Files of a leaderboard, and what each holds.
FILES = {"README.md": "the tables as Markdown", "index.html": "the tables as a web page",
         "suite.json": "the suite's manifest"}


def check_layout(root: str | Path, names: Iterable[str] | None = None) -> None:
    """Refuse a file where the folder keeps a folder and a folder where it keeps a file
    (``names``: only these; default all). Missing ones are fine: they are created when needed."""
    root = Path(root)
    for name in names if names is not None else [*FOLDERS, *FILES]:
        path = root / name
        if name in FOLDERS and path.exists() and not path.is_dir():
            raise UserError(f"{name} is a file, where a leaderboard keeps {FOLDERS[name]} in a folder",
                            where=str(path), fix=f"move or delete that file (a leaderboard's {name}/ is a folder), "
                                                 "then run the command again")
        if name in FILES and path.is_dir():
            raise UserError(f"{name} is a folder, where a leaderboard keeps {FILES[name]} in a file",
                            where=str(path), fix=f"move or delete that folder (render writes {name} there), "
                                                 "then run the command again")
