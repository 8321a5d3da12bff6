"""Which code made a number: the git commit of clbench's own code, and whether its tree was clean.

A result is only worth what its code can be found again. Every result records the commit of
the git work tree that holds the imported ``clbench`` package (``env.git_commit``) and whether
that tree had uncommitted changes to tracked code (``env.git_dirty``): files under
:data:`CODE_PATHS`, staged or not, as ``git status --porcelain --untracked-files=no`` lists
them. Code, not every file: a leaderboard's own entries, another leaderboard being
regenerated, docs and configs (an entry records its resolved config) change no number, while an
untracked file is not code a checkout brings back.

Everything here answers ``None`` where there is no git (clbench installed from a wheel, no
``git`` program): a released version is identified by ``harness.version`` instead.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

# The tracked files whose changes can change a result computed from a recorded config (git
# pathspecs): the package with its strategies, benchmarks and their assets, the dependency pins,
# and any Python file (a plugin loaded by file path, ``examples/my_strategy.py:Mine``). The
# top-level ``strategies`` and ``benchmarks`` are where the built-in methods and streams lived
# before they moved into the package: a diff against an entry's older commit counts them too.
CODE_PATHS = ("clbench", "strategies", "benchmarks", "pyproject.toml", "*.py")


def _git(args: list[str], cwd: Path) -> str | None:
    """``git ARGS`` in ``cwd``: its stdout, or None when git fails or is missing."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def repo_of(folder: str | Path) -> Path | None:
    """The top of the git work tree holding ``folder`` (or its nearest existing parent); None outside one."""
    folder = Path(folder).absolute()
    while not folder.is_dir():
        if folder.parent == folder:
            return None
        folder = folder.parent
    top = _git(["rev-parse", "--show-toplevel"], folder)
    return Path(top.strip()).resolve() if top and top.strip() else None


def code_repo() -> Path | None:
    """The top of the git work tree the running clbench package was imported from, if any."""
    return repo_of(Path(__file__).resolve().parent)


def tracked(path: str | Path, repos: list[Path | None]) -> Path | None:
    """The first of ``repos`` (git work trees) whose git tracks the file ``path`` (links resolved), if any.

    A file git tracks was committed or staged there, so it did not arrive with a folder copied or
    unpacked beside it; None without git.
    """
    target = Path(path).resolve()
    for repo in repos:
        if repo is None or not target.is_relative_to(repo):
            continue
        name = target.relative_to(repo).as_posix()
        if _git(["--literal-pathspecs", "ls-files", "--error-unmatch", "--", name], repo) is not None:
            return repo
    return None


def head_commit(repo: Path | None = None) -> str | None:
    repo = repo or code_repo()
    out = _git(["rev-parse", "HEAD"], repo) if repo else None
    return (out.strip() or None) if out else None


def uncommitted_files(repo: Path | None = None) -> list[str] | None:
    """Tracked code files (:data:`CODE_PATHS`) of ``repo`` (default: clbench's) with uncommitted changes.

    Staged or not; None when there is no git work tree.
    """
    repo = repo or code_repo()
    if repo is None:
        return None
    out = _git(["status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS], repo)
    if out is None:
        return None
    return [line[3:] for line in out.splitlines() if line.strip()]


def git_state() -> tuple[str | None, bool | None]:
    """(commit, dirty) of clbench's work tree; both None without git."""
    repo = code_repo()
    commit = head_commit(repo) if repo else None
    if commit is None:
        return None, None
    changed = uncommitted_files(repo)
    return commit, (bool(changed) if changed is not None else None)


def code_changes(old: str, new: str, repo: Path | None = None) -> list[str] | None:
    """Files under :data:`CODE_PATHS` that differ between commits ``old`` and ``new``.

    None when either commit is not in the repository (a shallow clone, a commit never pushed).
    """
    repo = repo or code_repo()
    if repo is None or old == new:
        return [] if repo is not None else None
    for commit in (old, new):
        if _git(["cat-file", "-e", f"{commit}^{{commit}}"], repo) is None:
            return None
    out = _git(["diff", "--name-only", old, new, "--", *CODE_PATHS], repo)
    return out.split() if out is not None else None
