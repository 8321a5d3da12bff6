"""An entry rerun under the CPU kernels it recorded, in this process where it can, else in a fresh one.

A process computes at one kernel level, fixed before its first tensor operation
(:mod:`clbench.cpu_kernels`). ``leaderboard verify`` reruns each entry at the level the
entry records (``env.cpu.pin``; for an entry that pinned nothing, ATen's level as it recorded it,
``env.cpu.isa``), so an AVX2 entry reruns as AVX2 on an AVX-512 machine. The first rerun of a
``verify`` command pins its own process; an entry that needs another level, or a process that
already used torch, is rerun in ``python -m clbench.leaderboard.rerun`` started under that level.
An entry whose level this CPU lacks (or one made on a GPU) is rerun as this machine computes, and
judged against its test set's noise instead of bit for bit (:mod:`clbench.leaderboard.verify`).

::

    python -m clbench.leaderboard.rerun ENTRY.json SCRATCH SOURCE

runs the entry's config into ``SCRATCH`` (:func:`clbench.leaderboard.cell.rerun`); the caller has
checked the entry (:mod:`~clbench.leaderboard.trust`) and reads the new entry from ``SCRATCH``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ENTRY_FILE = "committed-entry.json"


def variables_for(entry: dict) -> dict[str, str] | None:
    """The kernel variables that rerun ``entry`` as it ran; None where this machine cannot (a level
    its CPU lacks) or where the entry computed on a GPU (its kernels are not the CPU's)."""
    from clbench import cpu_kernels

    env = entry.get("env") or {}
    if env.get("cuda"):
        return None
    variables = cpu_kernels.rerun_variables(env.get("cpu"))
    level = variables.get("ATEN_CPU_CAPABILITY")
    if level is not None and level not in cpu_kernels.available():
        return None
    return variables


def rerun_entry(entry: dict, scratch: Path, *, source: str) -> tuple[dict, bool]:
    """(the rerun's entry, whether it ran at the entry's recorded kernel level)."""
    from clbench.cpu_kernels import pin
    from clbench.leaderboard.cell import rerun

    variables = variables_for(entry)
    if variables is None or pin(variables):
        return rerun(entry, scratch, source=source), variables is not None
    return _in_fresh_process(entry, scratch, source, variables), True


def _in_fresh_process(entry: dict, scratch: Path, source: str, variables: dict[str, str]) -> dict:
    from clbench.cpu_kernels import VARIABLES
    from clbench.io import write_json
    from clbench.leaderboard.entries import entry_path, read_entry

    path = scratch / ENTRY_FILE
    write_json(path, entry)
    env = {name: value for name, value in os.environ.items() if name not in VARIABLES}
    done = subprocess.run([sys.executable, "-m", "clbench.leaderboard.rerun", str(path), str(scratch), source],
                          env={**env, **variables}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:  # as a failed rerun in this process would be recorded
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        last = lines[-1].removeprefix("clbench: error: ") if lines else f"exit status {done.returncode}"
        return {"status": "failed", "error": f"in a process with {variables['ATEN_CPU_CAPABILITY']} kernels: {last}"}
    return read_entry(entry_path(scratch, entry["config_hash"]))


def main(argv: list[str] | None = None) -> int:
    from clbench.errors import exit_status

    entry_file, scratch, source = argv if argv is not None else sys.argv[1:]

    def rerun_here() -> int:
        from clbench.leaderboard.cell import rerun

        rerun(json.loads(Path(entry_file).read_text()), Path(scratch), source=source)
        return 0

    return exit_status(rerun_here, "clbench: interrupted")


if __name__ == "__main__":
    sys.exit(main())
