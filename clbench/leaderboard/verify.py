"""``clbench leaderboard verify``: rerun committed entries from their recorded configs and compare.

A leaderboard's numbers are only as good as their reruns. Each entry records its resolved
config, so it is run again exactly as ``leaderboard run`` runs a grid point
(:func:`~clbench.leaderboard.cell.rerun`: same runner, same entry, the entry's torch thread
count), in a temporary folder (the leaderboard directory is only read), and its ``r_matrix``,
``r_init``, the other metrics' ``matrices`` and every score are compared with the committed
ones. One verdict per entry:

* ``ok``: every number equal (or within ``tolerance``; the largest difference is still given);
* ``within noise: X SE at ...``: an entry that cannot be bit-exact here differs by at most 2 of
  its test set's standard errors (below);
* ``differs by X at R[i][j]``: the largest difference, where it is, both values, and what
  differs in how it was made (another commit, device or package version);
* ``cannot rerun: why``: the run was made from uncommitted code (``env.git_dirty``: that code
  cannot be found again), it is a failed run (nothing to compare), it needs a GPU this machine
  lacks, the rerun stopped on bad input (e.g. a data root that is not here), or, with
  ``same_code``, it was made by a commit whose code (:data:`~clbench.results.provenance.CODE_PATHS`)
  differs from the checkout's.

By default an entry made by another commit is still rerun with the checked-out code: the
question a reader of a committed table asks is whether it holds for this code, and
``leaderboard run --force`` is how a table follows a code change. The verdict then names both
commits and how many code files differ between them.

CPU float rounding depends on the kernels' instruction set, so each entry is rerun at the CPU
kernel level it records (:mod:`~clbench.leaderboard.rerun`: ``env.cpu.pin``, the level a suite
pins, AVX2 by default; else ATen's level as recorded), in the precision and with the torch
threads it records: an AVX2 entry reruns bit-exactly on an AVX-512 machine of its CPU's vendor.
An entry that cannot promise that here (made on a GPU, in bf16-mixed or with unpinned kernels on
another CPU, pinned on another vendor's CPU, or at a level this CPU lacks:
:mod:`~clbench.leaderboard.noise`) and differs is judged against its test
set's standard errors: ``within noise: 0.4 SE at R[2][1]`` up to 2 SE, else ``differs``. Entries
record the CPU's model and kernel level (``env.cpu``), and a verdict names them when they
differ. ``sample`` picks the
``n`` cheapest ok entries by recorded wall time (ties by hash), so CI can verify a sample of
every committed leaderboard in its time budget.

A folder to verify may come from anyone, and rerunning a config runs the code it names: unless
``trust_code`` (``--trust-code``), every entry is checked first (:mod:`~clbench.leaderboard.trust`,
before anything is imported or run): its components must be registered code of installed
packages, and its values within those of the suite it claims to come from.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from clbench.errors import UserError
from clbench.leaderboard.entries import ENTRIES_DIR, check_entry_names, entries_dir, read_entry
from clbench.leaderboard.layout import check_layout
from clbench.results.record import Status

OK, NOISE, DIFFERS, CANNOT = "ok", "within noise", "differs", "cannot rerun"


@dataclass
class Verdict:
    """What verifying one entry found; ``line`` is what the command prints for it."""

    digest: str
    label: str
    status: str  # OK, NOISE, DIFFERS or CANNOT
    detail: str = ""
    largest: float | None = None  # the largest absolute difference found (ok and differs)
    where: str | None = None
    other_cpu: bool = False  # computed on CPU, and the entry records another CPU than the rerun's, or none

    @property
    def line(self) -> str:
        if self.status in (CANNOT, NOISE):
            text = f"{self.status}: {self.detail}"
        elif self.status == DIFFERS:
            text = f"{DIFFERS} {self.detail}"
        else:
            text = f"{OK} ({self.detail})" if self.detail else OK
        return f"{self.digest[:12]} {self.label}: {text}"


def entry_label(entry: dict) -> str:
    return (f"{entry['strategy']['name']} · {entry['benchmark']['name']} · {entry['model']['name']} · "
            f"order {entry['order_label']} · seed {entry['seed']}")


# -- what to verify ---------------------------------------------------------------------------
def select(root: str | Path, ids: list[str] | None = None, sample: int | None = None) -> list[Path]:
    """The entry files to verify: ``ids`` (full hashes or unique prefixes) or all, then the ``sample`` cheapest."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"leaderboard directory {root} does not exist", where=str(root),
                        fix="give a folder made by 'clbench leaderboard run'")
    check_layout(root, [ENTRIES_DIR])
    if not entries_dir(root).is_dir():
        raise UserError(f"no {ENTRIES_DIR}/ folder in {root}", where=str(root),
                        fix="give a folder made by 'clbench leaderboard run'")
    names = [name[:-len(".json")] for name in check_entry_names(root)]
    chosen = names
    if ids:
        chosen = []
        for given in ids:
            key = given.lower().removesuffix(".json")
            hits = [n for n in names if n.startswith(key)] if len(key) >= 4 else []
            if len(hits) != 1:
                what = "no entry" if not hits else f"{len(hits)} entries start with"
                raise UserError(f"{what} {given!r} in {entries_dir(root)}", where="ENTRY_ID",
                                fix="give an entry's config hash (its file name), or enough of it to be unique "
                                    "(at least 4 characters)")
            if hits[0] not in chosen:
                chosen.append(hits[0])
    paths = [entries_dir(root) / f"{name}.json" for name in chosen]
    if sample is not None:
        if sample < 1:
            raise UserError(f"expected at least 1, got {sample}", where="--sample", fix="e.g. --sample 2")
        paths = cheapest(paths, sample)
    return paths


def cheapest(paths: list[Path], n: int) -> list[Path]:
    """The ``n`` ok entries with the least recorded wall time (ties: by hash); an entry that does not read comes first."""
    from clbench.received import read_json

    def cost(path: Path) -> tuple[float, str]:
        try:
            entry = read_json(path, fix="")
            if entry.get("status") != Status.OK:
                return math.inf, path.name
            return float(entry["compute"]["wall_seconds"]), path.name
        except (UserError, ValueError, KeyError, TypeError, AttributeError, OverflowError):
            return -1.0, path.name  # damaged: verifying it will say so, and cheaply
    costed = sorted((cost(p), p) for p in paths)
    return [p for (seconds, _), p in costed if seconds != math.inf][:n]


# -- comparing ----------------------------------------------------------------------------------
def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _pairs(old, new, where: str) -> Iterator[tuple[str, object, object]]:
    """(location, committed, rerun) for every number in two nested lists/dicts of the same shape."""
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            yield from _pairs(a, b, f"{where}[{i}]")
    elif isinstance(old, dict) and isinstance(new, dict) and old.keys() == new.keys():
        for key in sorted(old):
            yield from _pairs(old[key], new[key], f"{where}.{key}" if where else key)
    else:
        yield where, old, new


def _distance(a, b) -> float:
    if _number(a) and _number(b):
        if math.isnan(a) and math.isnan(b):
            return 0.0
        return abs(float(a) - float(b))
    return 0.0 if a == b else math.inf


def compare(committed: dict, rerun: dict) -> tuple[float, str | None, object, object]:
    """(largest difference, where, committed value, rerun value) over R, r_init, matrices and scores.

    A difference of shape (another number of rows, a score one side lacks) counts as infinite.
    """
    fields = (("R", "r_matrix"), ("r_init", "r_init"), ("", "matrices"), ("scores", "scores"))
    worst: tuple[float, str | None, object, object] = (0.0, None, None, None)
    for label, key in fields:
        for where, a, b in _pairs(committed.get(key), rerun.get(key), label):
            gap = _distance(a, b)
            if worst[1] is None or gap > worst[0]:
                worst = (gap, where, a, b)
    return worst


def _shown(value) -> str:
    if _number(value):
        return f"{value:.6g}"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return f"keys {', '.join(sorted(value))}" if value else "nothing"
    return "nothing" if value is None else repr(value)


def _machine(env: dict) -> str:
    device = env.get("device") or "?"
    return device + (f" (CUDA {env['cuda']})" if env.get("cuda") else "")


def _cpu(env: dict) -> str | None:
    """The CPU and, where it is not fp32 (``env.precision``, absent before it was recorded), the precision."""
    cpu = env.get("cpu")
    precision = env.get("precision") or "32-true"
    tail = "" if precision == "32-true" else f", {precision}"
    return f"{cpu.get('model')} ({cpu.get('isa')}{tail})" if isinstance(cpu, dict) else None


def _cpu_change(old: dict, new: dict) -> tuple[str | None, str | None]:
    """(note for any verdict, note for a differing one) about the CPUs of a run computed on CPU:
    their model and instruction set where both are recorded and differ, or that the entry does not
    record its CPU (entries made before ``env.cpu`` existed)."""
    if old.get("cuda") or new.get("cuda"):
        return None, None
    before, after = _cpu(old), _cpu(new)
    if before is None:
        return None, f"the entry does not record its CPU, and float rounding differs between CPU types " \
                     f"(this one: {after})"
    return (f"made on {before}, rerun on {after}" if before != after else None), None


def _package_changes(old: dict, new: dict) -> str | None:
    """``"transformers 5.23.0 -> 5.24.0, ..."`` for every recorded package whose version differs."""
    before, after = old.get("packages") or {}, new.get("packages") or {}
    changed = [f"{name} {before.get(name)} -> {after.get(name)}" for name in sorted(set(before) | set(after))
               if name != "clbench" and before.get(name) != after.get(name)]
    return ", ".join(changed) or None


def _too_many_threads(entry: dict) -> str | None:
    """Why the entry's recorded torch threads (``execution.torch_threads``) cannot be given here, or
    None: a rerun takes them as recorded (fewer round differently), and more threads than CPUs
    only wait for each other, or fail to start at all (500 of them)."""
    from clbench.limits import usable_cpus

    threads, cpus = (entry.get("execution") or {}).get("torch_threads"), usable_cpus()
    if threads is None or threads <= cpus:
        return None
    return (f"made with {threads} torch threads, and this process may use {cpus} CPUs (fewer threads round "
            f"differently: verify it on a machine with at least {threads} CPUs)")


# -- one entry ----------------------------------------------------------------------------------
class Verifier:
    """Verify entries one at a time against the checked-out code (see the module notes)."""

    def __init__(self, tolerance: float = 0.0, same_code: bool = False, trust_code: bool = False):
        from clbench.results.provenance import code_repo, head_commit

        if not (tolerance >= 0 and math.isfinite(tolerance)):
            raise UserError(f"expected a finite number >= 0, got {tolerance}", where="--tolerance",
                            fix="e.g. --tolerance 1e-6 (0: exact)")
        self.tolerance, self.same_code, self.trust_code = tolerance, same_code, trust_code
        self._bounds: dict[Path, object] = {}
        self.repo = code_repo()
        self.head = head_commit(self.repo) if self.repo else None

    def _commit_note(self, made_by: str | None) -> tuple[str | None, str | None]:
        """(note for the verdict, reason it cannot be rerun under ``same_code``) about the commit that made it."""
        from clbench.results.provenance import code_changes

        if made_by == self.head and made_by is not None:
            return None, None
        short = (made_by or "")[:12] or "an unrecorded commit"
        here = (self.head or "")[:12] or "no git checkout"
        if made_by is None or self.head is None:
            note = f"made by {short}, checked out {here}"
            return note, note + ": the code that made it cannot be compared with this one"
        changed = code_changes(made_by, self.head, self.repo)
        if changed is None:
            note = f"made by {short}, which this repository does not have; checked out {here}"
            return note, note + f" (fetch the full history, or check out {short})"
        if not changed:
            return f"made by {short}, checked out {here}, same code", None
        files = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        note = f"made by {short}, checked out {here}: {len(changed)} code file(s) differ"
        return note, f"made by {short}, checked out {here}, and the code differs in {files} (check out {short} " \
                     "to rerun it with its own code, or verify without --same-code)"

    def check(self, paths: list[Path]) -> None:
        """Refuse (:class:`UserError`) the first entry whose rerun would run code that is not installed,
        or ask more than its suite (:mod:`~clbench.leaderboard.trust`); nothing is imported. Entries
        that do not read, or failed runs, are left to :meth:`verify`, which reruns neither."""
        for path in paths:
            try:
                entry = read_entry(path)
            except UserError:
                continue
            self._check_trust(entry, Path(path))

    def _check_trust(self, entry: dict, path: Path) -> None:
        from clbench.leaderboard.trust import check_entry, suite_bounds

        if self.trust_code or entry["status"] != Status.OK or (entry.get("env") or {}).get("git_dirty"):
            return  # failed runs and runs of uncommitted code are never rerun
        root = path.resolve().parent.parent
        if root not in self._bounds:
            self._bounds[root] = suite_bounds(path.parent.parent)
        check_entry(entry, path, self._bounds[root])

    def verify(self, path: Path) -> Verdict:
        digest = path.stem
        try:
            entry = read_entry(path)
        except UserError as err:  # damaged or forged: the committed entry itself does not hold
            return Verdict(digest, "(unreadable entry)", DIFFERS, f"from its own record: {err.one_line()}",
                           largest=math.inf)
        label = entry_label(entry)
        if entry["status"] != Status.OK:
            return Verdict(digest, label, CANNOT, "the committed run failed, so there is nothing to compare "
                                                  f"({entry.get('error')})")
        self._check_trust(entry, Path(path))  # before anything the entry names is imported
        env = entry.get("env") or {}
        made_by = env.get("git_commit") or entry["harness"].get("git_commit")
        if env.get("git_dirty"):
            return Verdict(digest, label, CANNOT, f"made from uncommitted code (changes on top of "
                                                  f"{(made_by or '?')[:12]}); regenerate it from a clean tree")
        if env.get("cuda"):
            import torch

            if not torch.cuda.is_available():
                return Verdict(digest, label, CANNOT, f"made on a GPU ({env.get('device')}) and this machine has none")
        too_many = _too_many_threads(entry)
        if too_many:
            return Verdict(digest, label, CANNOT, too_many)
        note, refusal = self._commit_note(made_by)
        if refusal and self.same_code:
            return Verdict(digest, label, CANNOT, refusal)
        from clbench.leaderboard.noise import NOISE_SE, largest_in_se, why_not_exact
        from clbench.leaderboard.rerun import rerun_entry

        with tempfile.TemporaryDirectory(prefix="clbench-verify.") as scratch:
            new, at_level = rerun_entry(entry, Path(scratch), source=str(path))
        if new["status"] != Status.OK:
            return Verdict(digest, label, CANNOT, f"the rerun stopped: {new.get('error')}")
        largest, where, old_value, new_value = compare(entry, new)
        notes = [note] if note else []
        if _machine(env) != _machine(new["env"]):
            notes.append(f"made on {_machine(env)}, rerun on {_machine(new['env'])}")
        cpu, unrecorded_cpu = _cpu_change(env, new["env"])
        if cpu:
            notes.append(cpu)
        packages = _package_changes(env, new["env"])
        if packages:
            notes.append(f"packages differ: {packages}")
        if largest <= self.tolerance:
            shown = "exact" if largest == 0 else f"largest difference {largest:.3g} at {where}, within {self.tolerance:g}"
            return Verdict(digest, label, OK, "; ".join([shown, *notes]), largest=largest, where=where,
                           other_cpu=bool(cpu or unrecorded_cpu))
        not_exact = why_not_exact(env, new["env"], at_level)
        if not_exact:  # judged against the test set's noise, not bit for bit
            in_se, se_where = largest_in_se(entry, new)
            judged = f"{in_se:.2g} SE at {se_where}" if math.isfinite(in_se) else f"beyond any SE ({se_where})"
            if in_se <= NOISE_SE:
                return Verdict(digest, label, NOISE, "; ".join([f"{judged} (largest difference {largest:.3g} at "
                                                                f"{where}); {not_exact}", *notes]),
                               largest=largest, where=where, other_cpu=bool(cpu or unrecorded_cpu))
            notes.append(f"{judged}, beyond the {NOISE_SE:g} SE a rerun that is {not_exact} may differ by")
        if unrecorded_cpu:
            notes.append(unrecorded_cpu)
        gap = f"{largest:.3g}" if math.isfinite(largest) else "shape"
        detail = f"by {gap} at {where} (committed {_shown(old_value)}, rerun {_shown(new_value)})"
        if self.tolerance:
            detail += f", beyond {self.tolerance:g}"
        return Verdict(digest, label, DIFFERS, "; ".join([detail, *notes]), largest=largest, where=where,
                       other_cpu=bool(cpu or unrecorded_cpu))
