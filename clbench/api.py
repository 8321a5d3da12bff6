"""The Python API: what the command line does, from a script or a notebook.

    import clbench

    cfg = clbench.load_config("configs/examples/digits-domains-replay.yaml", ["train.epochs=1"])
    result = clbench.run(cfg, "runs/replay")          # a RunResult
    model = clbench.load_model("runs/replay")          # the trained torch.nn.Module
    result.scores["acc"], result.r_matrix, result.path

    board = clbench.run_leaderboard("configs/suites/quickstart.yaml", "runs/quickstart")
    board.table()                                      # the leaderboard as rows of dicts
    clbench.compare("runs/quickstart", a="replay", b="naive")

A config is the same mapping a YAML file holds (``load_config`` accepts a path or a dict, plus
command-line style overrides) and is checked the same way: bad input raises
:class:`clbench.errors.UserError` with the one-line message the CLI would print. Results are
the same files the CLI writes; :class:`RunResult` is a typed view of ``result.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from clbench.leaderboard.schema import Entry

__all__ = ["RunResult", "Leaderboard", "load_config", "run", "load_model", "run_leaderboard", "load_leaderboard",
           "compare"]


@dataclass(frozen=True)
class RunResult:
    """One run's outcome. ``r_matrix[i][j]``: score on test experience ``j`` after training
    experience ``i`` (run order); ``r_init``: the untrained model's row; ``scores``: ACC, BWT, ...
    as fractions (docs/metrics.md); ``record``: the whole ``result.json``."""

    experiences: list[str]
    r_matrix: list[list[float | None]]
    r_init: list[float | None]
    scores: dict[str, Any]
    config: dict
    config_hash: str
    path: Path | None
    record: dict = field(repr=False)

    @classmethod
    def from_record(cls, record: dict, path: str | Path | None = None) -> RunResult:
        return cls(experiences=list(record["experiences"]), r_matrix=record["r_matrix"], r_init=record["r_init"],
                   scores=dict(record["scores"]), config=record["config"], config_hash=record["config_hash"],
                   path=Path(path) if path is not None else None, record=record)

    @property
    def single_stage(self) -> bool:
        """Whether the run trained once on the whole stream (joint training: one row of R), as it
        recorded (:func:`clbench.results.record.single_stage`)."""
        from clbench.results.record import single_stage

        return single_stage(self.record)

    @classmethod
    def load(cls, folder: str | Path) -> RunResult:
        """A finished run's folder (its ``result.json``)."""
        import json

        from clbench.errors import UserError
        from clbench.engine.outputs import RESULT

        folder = _path_argument(folder, "folder")
        path = folder / RESULT
        if not path.is_file():
            raise UserError(f"{path} does not exist", where=str(folder), fix="give the --output folder of a finished run")
        fix = "rerun the run into that folder with overwrite=True (or clbench run --overwrite)"
        from clbench.received import read_text

        try:
            record = json.loads(read_text(path, fix=fix))  # a pipe or a device in its place is not read
        except json.JSONDecodeError as err:
            what = "the file is empty" if not err.doc.strip() else \
                f"not valid JSON (line {err.lineno}, column {err.colno}): {err.msg}"
            raise UserError(what, where=str(path), fix=fix) from None
        missing = [key for key in _RESULT_KEYS if not isinstance(record, dict) or key not in record]
        if missing:
            raise UserError(f"not a finished run's result: {', '.join(missing)} missing", where=str(path), fix=fix)
        return cls.from_record(record, folder)


# What RunResult reads of result.json.
_RESULT_KEYS = ("experiences", "r_matrix", "r_init", "scores", "config", "config_hash")


def _path_argument(value: Any, name: str, *, optional: bool = False) -> Path | None:
    """A file or folder argument of the API as a Path; anything else is refused as the CLI would."""
    from clbench.errors import UserError

    if value is None and optional:
        return None
    if isinstance(value, (str, Path)) and str(value):
        return Path(value)
    raise UserError(f"expected a path (str or pathlib.Path), got {type(value).__name__} {value!r}", where=name,
                    fix=f"give {name} as a path" + (", or None" if optional else ""))


def _overrides_argument(overrides: Any) -> list[str]:
    """``overrides`` as a list of ``key.path=value`` strings; a bare string would be read one
    character at a time."""
    from clbench.errors import UserError

    fix = "give a list of 'key.path=value' strings, e.g. overrides=['train.epochs=2']"
    if isinstance(overrides, (str, bytes)):
        raise UserError(f"expected a list of overrides, got a single {type(overrides).__name__} {overrides!r}",
                        where="overrides", fix=f"put it in a list: overrides=[{overrides!r}]")
    try:
        items = list(overrides)
    except TypeError:
        raise UserError(f"expected a list of overrides, got {type(overrides).__name__} {overrides!r}",
                        where="overrides", fix=fix) from None
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise UserError(f"expected a 'key.path=value' string, got {type(item).__name__} {item!r}",
                            where=f"overrides[{i}]", fix=fix)
    return items


def load_config(config: str | Path | dict, overrides: Iterable[str] = ()) -> dict:
    """A resolved, checked config from a YAML file or a mapping, with ``key.path=value`` overrides."""
    from clbench.config.load import load_config as load_file
    from clbench.config.load import resolve_config

    from clbench.errors import UserError

    overrides = _overrides_argument(overrides)
    if isinstance(config, dict):
        return resolve_config(config, source="config", overrides=overrides)
    if not isinstance(config, (str, Path)) or not str(config):
        raise UserError(f"expected a config file path or a mapping, got {type(config).__name__} {config!r}",
                        where="config", fix="give a YAML file's path, or the config as a dict")
    return load_file(config, overrides)


def run(config: str | Path | dict, output: str | Path | None = None, *, overrides: Iterable[str] = (),
        resume: bool = False, overwrite: bool = False, progress: bool = False,
        threads: int | str | None = "auto", cpu_kernels: str = "native") -> RunResult:
    """Run one config (a path, a mapping or a resolved config) and return its result.

    ``output`` receives ``result.json``, the checkpoint and logs, as ``clbench run --output``
    does (``None``: nothing is written). ``threads`` is torch's intra-op thread count for the run,
    decided as the CLI's ``--threads`` decides it (:func:`clbench.limits.decide_threads`): a number,
    or ``"auto"`` (the default; ``None`` too), 1 on fewer than 4 cores, else the cores divided
    by ``trainer.devices``. So a config run here and by ``clbench run`` gives the same CPU result
    (the order of floating-point reductions depends on the thread count). Torch's setting is put
    back when the run returns. ``cpu_kernels`` pins the CPU kernels' instruction set as
    ``--cpu-kernels`` does (``"avx2"``: the same floats on any x86-64 CPU with AVX2); a pin takes
    effect only before this Python process's first tensor operation (a clear error otherwise).
    """
    output = _path_argument(output, "output", optional=True)
    from clbench.limits import decide_threads, torch_threads

    cfg = load_config(config, overrides)
    source = str(config) if not isinstance(config, dict) else "config"
    count = decide_threads(threads, cfg["trainer"], where="threads")
    from clbench.cpu_kernels import pin_for_run

    pin_for_run(cpu_kernels, where="cpu_kernels")
    from clbench.engine.runner import run as run_config

    with torch_threads(count):
        record = run_config(cfg, output, source=source, resume=resume, overwrite=overwrite, progress=progress)
    return RunResult.from_record(record, output)


def load_model(run_dir: str | Path, experience: int | None = None, *, trust_code: bool = False):
    """The model a finished run trained (a ``torch.nn.Module`` in eval mode, on the CPU), rebuilt
    from the run's resolved config with the strategy's changes to its structure (adapters, MoE
    layers, grown MLPs) and the weights saved in ``run_dir/model/`` (safetensors and JSON only).

    ``experience=None``: after the last experience (``save.final``, the default); ``i``: after
    experience ``i``, R's row ``i`` (``save.every_experience``). The folder is input: a saved
    config naming, at any depth, a component that is not installed code (``path/x.py:Class``, a
    module in the working directory or in the folder) would run it, so it is refused before
    anything is imported unless ``trust_code``; a damaged or altered file is a :class:`UserError`
    naming the file and the field."""
    from clbench.engine.restore import load_model as load

    return load(run_dir, experience, trust_code=trust_code)


@dataclass(frozen=True)
class Leaderboard:
    """A leaderboard folder's entries (verified when read, typed: :class:`clbench.leaderboard.schema.Entry`;
    ``entry.document`` is its JSON) and its tables."""

    path: Path
    entries: list[Entry] = field(repr=False)

    def table(self) -> list[dict[str, Any]]:
        """One dict per table row: benchmark, strategy label, rank, rank group (letters), runs, and
        each score's mean, sample std over units and 95% interval (``ci95``: half-width; ``low``,
        ``high``: its ends cut at the score's bounds) over task orders, the replication unit
        (fractions; ``from_test_set``: one unit's test-set interval)."""
        from clbench.leaderboard.manifest import manifest_unranked
        from clbench.leaderboard.table import build_tables

        rows = []
        for table in build_tables(self.entries, source=str(self.path), unranked=manifest_unranked(self.path)):
            for row in table.rows:
                stats = {key: {"mean": s.mean, "std": s.std, "n": s.n, "units": s.units, "ci95": s.half, "low": s.low,
                               "high": s.high, "from_test_set": s.from_test_set}
                         for key, s in row.stats.items()}
                group = table.groups.letters.get(row.label) if table.groups else None
                rows.append({"benchmark": table.name, "strategy": row.label, "rank": row.rank, "group": group,
                             "runs": len(row.entries), "scores": stats})
        return rows

    def results(self) -> list[RunResult]:
        return [RunResult.from_record(e.document) for e in self.entries if e.ok]


def load_leaderboard(folder: str | Path) -> Leaderboard:
    """The entries of a leaderboard folder (a suite's grid only, when it has a manifest)."""
    from clbench.leaderboard.entries import load_entries
    from clbench.leaderboard.manifest import manifest_hashes

    return Leaderboard(Path(folder), load_entries(folder, manifest_hashes(folder)))


def run_leaderboard(suite: str | Path | None = None, output: str | Path = "leaderboard", *, jobs: int | None = None,
                    force: bool = False, retry_failed: bool = False, allow_dirty: bool = False,
                    progress: bool = False) -> Leaderboard:
    """Run a suite's missing grid points into ``output`` (``clbench leaderboard run``), serially
    in this process, or in ``jobs`` worker processes; return the leaderboard. ``allow_dirty``:
    as ``--allow-dirty`` (docs/leaderboard.md)."""
    from clbench.errors import UserError
    from clbench.leaderboard.suite import default_suite_path, load_suite

    if isinstance(suite, dict):  # unlike a run's config: the folder records the suite's file, which is read again
        raise UserError("expected a suite file's path, got a dict", where="suite",
                        fix="write the suite to a YAML file (yaml.safe_dump) and give its path: the leaderboard's "
                            "suite.json names that file, and worker processes and 'leaderboard verify' read it")
    suite, output = _path_argument(suite, "suite", optional=True), _path_argument(output, "output")
    loaded = load_suite(suite or default_suite_path())
    common = dict(progress=progress, retry_failed=retry_failed, force=force, allow_dirty=allow_dirty)
    from clbench.leaderboard.cell import pin_kernels

    if not pin_kernels(loaded.cpu_kernels, str(loaded.path)) and jobs is None:
        import sys

        from clbench.cpu_kernels import in_effect

        print(f"clbench: note: this Python process computed with torch before, so the suite's cpu_kernels "
              f"{loaded.cpu_kernels} cannot take effect in it; its entries record {in_effect()} kernels, unpinned "
              "(jobs=N runs each grid point in a fresh, pinned process)", file=sys.stderr)
    if jobs is not None:
        from clbench.leaderboard.launch import run_local

        run_local(loaded, output, jobs=jobs, **common)
    else:
        from clbench.leaderboard.execute import run_suite

        run_suite(loaded, output, **common)
    return load_leaderboard(output)


def compare(folder: str | Path, *, metric: str = "acc", benchmark: str | None = None, a: str | None = None,
            b: str | None = None, plan: bool = False, gap: float | None = None) -> dict[str, Any]:
    """``clbench compare``'s report as a dict: per benchmark, each strategy's score per task
    order, worst order and range, Kendall's tau between orders, a paired test of ``a`` and ``b``;
    with ``plan``, the orders that test needs for 80% power and their machine hours (``gap``: the
    difference to plan for, as tables show it; default the observed one)."""
    from clbench.errors import UserError
    from clbench.leaderboard.compare import compare as compare_entries
    from clbench.leaderboard.entries import load_entries
    from clbench.leaderboard.manifest import manifest_hashes, manifest_unranked

    if a is not None and a == b:
        raise UserError(f"--a and --b both name '{a}': a paired test compares two different strategies",
                        where="--b", fix="give two different strategies, or leave --a/--b out for the two best")
    hashes = manifest_hashes(folder)  # with a suite manifest, compare the suite's grid only
    return compare_entries(load_entries(folder, hashes), metric=metric, benchmark=benchmark, a=a, b=b,
                           sequence=hashes, source=str(folder), planned=plan, gap=gap,
                           unranked=manifest_unranked(folder))
