"""Aggregate entries into leaderboard tables: one per benchmark, one row per method.

A *row* is every entry whose resolved config is the same once ``seed`` and ``order`` are set
aside: the same strategy (and hyper-parameters), model and training settings, run over
several orders and seeds. Each score is summarised over the table's replication unit
(:mod:`clbench.leaderboard.stats`: the task order, its seeds averaged; the seed where a table
has one order) as mean, sample standard deviation (``ddof=1``) and 95% interval of the
units' values; scores a run does not define (joint's BWT, G-mean on a balanced stream) are
left out of that score's mean, and ``n`` says how many runs each mean is over.
Rows are ranked by mean ``acc`` (the mean final value of R: higher is better for accuracy,
lower for an error; ties share the better rank). Failed runs are counted, never averaged.

Direction: an entry's ``r_metric`` says whether its R is higher- or lower-is-better (no
``r_metric``: accuracy, higher). Each CL score's direction follows from it, and an evaluation
metric's (``<metric>_final``, ``global_<metric>``) is what the entry recorded under ``metrics``
(the metric's class said it; entries from before that take the built-in metrics' from
:mod:`clbench.metrics.score_registry`) (:func:`score_direction`). A score whose direction is
unknown is refused, never ranked as higher-is-better; a table whose entries give one score two
directions is refused, and a table of a lower-is-better R marks every score column with ↑ or ↓.

Columns: the scores of :data:`SCORES` the entries have, then every other evaluation metric's
score they have (one a strategy or objective added, with its recorded title, unit and an
arrow for its direction).

Each mean carries a 95% interval (:mod:`clbench.leaderboard.stats`: Student's t over the units,
cut at the score's bounds; one unit: its test set's interval, where the runs recorded
``r_stderr``), and the rows of a table are put in rank groups on ``acc``
(:attr:`BenchmarkTable.groups`): methods sharing a letter are not significantly different. A row
whose runs the suite marks ``unranked`` (a baseline that did not function there) is shown below
the ranked rows with its reason, in no rank and no group.

Rows are labelled by their strategy name; where two rows of one table share it (two models,
two buffer sizes), the config fields that tell them apart are appended.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from clbench.config.load import canonical_json
from clbench.leaderboard.labels import disambiguate
from clbench.errors import UserError
from clbench.metrics.score_registry import RANK_BY, TABLE_SCORES, Score, higher_is_better, score as score_meta
from clbench.results.record import Status
from clbench.registry import display_name
from clbench.leaderboard.page_stats import competition_ranks
from clbench.leaderboard.stats import (Groups, Interval, interval, is_cut, rank_groups,
                                      replication_unit, unit_means)
from clbench.metrics.stderr import entry_score_stderr
from clbench.leaderboard.schema import Entry, ObjectiveRecord, OkEntry

# Score columns, titles, units and directions: clbench.metrics.score_registry.
SCORES = TABLE_SCORES
_IGNORED = ("seed", "order", "logging", "save")


def scoring(objective: ObjectiveRecord) -> str | None:
    """Which scoring made a generated-text entry's R, from its ``objective`` (``trace``: TRACE's
    own evaluation; ``normalized``: the lenient metrics; ``mixed``), None for other objectives.
    Entries from before the causal-LM objective recorded it were all scored ``normalized``."""
    if objective.scoring:
        return objective.scoring
    return "normalized" if objective.name == "CausalLanguageModeling" else None


def score_direction(key: str, entry: OkEntry) -> bool:
    """Whether a larger value of score ``key`` is better in ``entry``, for the entry's R
    (:func:`clbench.metrics.score_registry.higher_is_better`)."""
    return higher_is_better(key, entry.r_metric.higher_is_better, entry.r_metric.names, entry.recorded_metrics)


def _metric_score(key: str) -> bool:
    """Whether ``key`` is an evaluation metric's score (``<metric>_final``, ``global_<metric>``)."""
    return key.endswith("_final") or key.startswith("global_")


def arrow(higher: bool) -> str:
    return "↑" if higher else "↓"


@dataclass
class Stat:
    """Mean and sample standard deviation of one score over ``units`` replication units (``std``
    is None for one) of ``n`` runs, and its 95% interval: ``half`` the t interval's half-width
    over the units, or for one unit its test set's (``from_test_set``); ``low``/``high`` its ends
    cut at the score's bounds (None where unknown)."""

    mean: float
    std: float | None
    n: int
    half: float | None = None
    from_test_set: bool = False
    units: int = 1
    low: float | None = None
    high: float | None = None

    @property
    def cut(self) -> bool:
        """Whether a bound of the score cut the interval (it is then written by its ends)."""
        return is_cut(self.mean, self.half, self.low, self.high)

    @classmethod
    def of(cls, ci: Interval, runs: int) -> Stat:
        """The summary of ``runs`` runs whose units' mean has the interval ``ci``."""
        return cls(mean=ci.mean, std=ci.sd, n=runs, half=ci.half, from_test_set=ci.test_set, units=ci.n,
                   low=ci.low, high=ci.high)


def made_dirty(entry: Entry) -> bool:
    """Whether the entry was made from a tree with uncommitted changes (``env.git_dirty``)."""
    return entry.env.git_dirty


@dataclass
class Row:
    key: str
    label: str
    strategy: str
    model: str
    entries: list[Entry]
    stats: dict[str, Stat] = field(default_factory=dict)
    rank: int | None = None
    unranked: str | None = None  # why the suite shows this row below the ranking (suite.json), else None

    @property
    def ok(self) -> list[OkEntry]:
        return [e for e in self.entries if e.ok]

    @property
    def failed(self) -> list[Entry]:
        return [e for e in self.entries if e.status == Status.FAILED]

    @property
    def dirty(self) -> list[Entry]:
        """Runs made from uncommitted code (``env.git_dirty``): their code cannot be found again."""
        return [e for e in self.entries if made_dirty(e)]

    @property
    def wall_seconds(self) -> float | None:
        values = [e.compute.wall_seconds for e in self.ok if e.compute.wall_seconds is not None]
        return sum(values) / len(values) if values else None

    @property
    def params_trainable(self) -> int | None:
        values = [e.model.params_trainable for e in self.ok]
        return values[0] if values and values[0] is not None else None


@dataclass
class BenchmarkTable:
    key: str
    name: str
    label: str
    scores: list[str]
    rows: list[Row]
    # score -> whether higher is better, for every score of the table's entries
    higher: dict[str, bool] = field(default_factory=dict)
    r_names: list[str] = field(default_factory=list)  # R's metric names (empty: accuracy, no r_metric)
    scorings: list[str] = field(default_factory=list)  # how generated text was scored (see scoring)
    groups: Groups | None = None  # rank groups on RANK_BY (clbench.leaderboard.stats)
    # score -> its title, unit and direction, as the entries recorded them (clbench.metrics.score_registry)
    meta: dict[str, Score] = field(default_factory=dict)
    # scores shown as — because the table's runs make them constant by construction (see constant_scores)
    constant: list[str] = field(default_factory=list)

    @property
    def r_higher(self) -> bool:
        return self.higher.get(RANK_BY, True)

    @property
    def percent(self) -> bool:
        """Whether R's scores are percentages (else plain numbers in R's own unit, e.g. a squared error)."""
        return self.score(RANK_BY).percent

    @property
    def marked(self) -> bool:
        """Whether columns carry direction arrows: for a lower-is-better R (accuracy tables stay as they were)."""
        return not self.r_higher

    @property
    def op_title(self) -> str | None:
        """What ACC is headed on a generated-text stream whose tasks have metrics of their own
        (TRACE: accuracy, ROUGE-L, SARI, edit similarity): R's final mean is then TRACE's overall
        performance (OP), not an accuracy; "OP (TRACE)" where every run was scored by TRACE's own
        scripts, "OP" where the lenient scoring made it. None for other tables."""
        if not self.scorings or len(set(self.r_names)) < 2:
            return None
        return "OP (TRACE)" if self.scorings == ["trace"] else "OP"

    def score(self, key: str) -> Score:
        """What score ``key`` is in this table (its entries' record; a built-in key otherwise)."""
        return self.meta.get(key) or score_meta(key)

    def title(self, score: str) -> str:
        meta = self.score(score)
        shown = self.op_title if score == RANK_BY and self.op_title else meta.title
        added = score not in SCORES  # a metric a strategy or objective added: its direction is not folklore
        return f"{shown} {arrow(self.higher.get(score, True))}" if (self.marked and meta.direction != "none") or added \
            else shown

    def ranked_by(self) -> str:
        return f"ranked by {self.title(RANK_BY).removesuffix(' ↓').removesuffix(' ↑')}" + ("" if self.r_higher else " (lower is better)")

    @property
    def orders(self) -> list[str]:
        """Order labels in the order they first appear (grid order for a suite)."""
        seen: list[str] = []
        for row in self.rows:
            for e in row.entries:
                if e.order_label not in seen:
                    seen.append(e.order_label)
        return seen


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def summarize(runs: dict[tuple, tuple[Any, float | None]], unit: str,
              bounds: tuple[float, float] | None = None) -> Stat | None:
    """Mean, sd and 95% interval over the units of the finite values of ``runs``: (order, seed)
    -> (value, its test-set standard error or None); the error gives the interval of a single unit."""
    kept = {key: (float(v), se) for key, (v, se) in runs.items() if _finite(v)}
    if not kept:
        return None
    means = list(unit_means(kept, unit).values())
    return Stat.of(interval([m for m, _ in means], means[0][1], bounds), len(kept))


def _rank(rows: list[Row], higher: bool = True) -> None:
    """Competition ranking ("1224") by mean ``acc`` in its direction; ties share a rank. Rows the
    suite marks unranked take no rank."""
    scored = [r for r in rows if RANK_BY in r.stats and r.unranked is None]
    ranks = competition_ranks([-r.stats[RANK_BY].mean if higher else r.stats[RANK_BY].mean for r in scored])
    for row, rank in zip(scored, ranks):
        row.rank = rank


def _order_key(label: str) -> tuple:
    """Named orders first (default, reverse), then the rest with numbers compared as numbers."""
    named = {"default": 0, "reverse": 1}
    parts = tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", label) if p)
    return (named.get(label, 2), tuple((0, p) if isinstance(p, int) else (1, p) for p in parts))


def _meta(entries: list[Entry]) -> dict[str, Score]:
    """score -> its metadata, from the first ok entry that has the score (directions are
    checked across entries by :func:`_directions`)."""
    out: dict[str, Score] = {}
    for e in entries:
        if not e.ok:
            continue
        for key in e.scores:
            if key not in out:
                out[key] = score_meta(key, e.r_metric.names, e.recorded_metrics)
    return out


def _directions(entries: list[Entry], label: str, source: str | None) -> dict[str, bool]:
    """score -> higher is better over the ok ``entries`` of one table; refuses a score with two
    directions, and one whose direction is unknown (:func:`score_direction`), naming the entry."""
    seen: dict[str, dict[bool, list[str]]] = {}
    for e in entries:
        if not e.ok:
            continue
        for key in e.scores:
            try:
                higher = score_direction(key, e)
            except UserError as err:
                folder = f"{source}/entries" if source else "entries"
                raise UserError(err.what, where=f"{folder}/{e.config_hash}.json: scores.{key}", fix=err.fix) from None
            seen.setdefault(key, {}).setdefault(higher, []).append(e.config_hash)
    for key, by in seen.items():
        if len(by) > 1:
            folder = f"{source}/entries" if source else "entries"
            raise UserError(f"entries of {label} mix directions for score '{key}': {len(by[True])} higher-is-better "
                            f"(e.g. {by[True][0]}.json), {len(by[False])} lower-is-better "
                            f"(e.g. {by[False][0]}.json)", where=folder,
                            fix="keep runs whose R metric points one way in one benchmark (see r_metric), or move "
                                "the others to another leaderboard directory")
    return {key: next(iter(by)) for key, by in seen.items()}


def build_tables(entries: list[Entry], sequence: list[str] | None = None, *,
                 source: str | None = None, unranked: dict[str, str] | None = None) -> list[BenchmarkTable]:
    """Per-benchmark tables over ``entries`` (any mix of suites, statuses, orders and seeds).

    ``sequence`` (config hashes, e.g. a suite's grid order) orders benchmarks and task orders as
    the suite lists them; without it benchmarks are alphabetical and orders go default,
    reverse, then the rest. ``source`` (the leaderboard directory) only names it in errors.
    ``unranked`` (config hash -> reason: :func:`clbench.leaderboard.manifest.manifest_unranked`)
    puts a row whose runs the suite marks below the ranked rows, with no rank and no rank group.
    """
    unranked = unranked or {}
    if sequence:
        position = {h: i for i, h in enumerate(sequence)}
        entries = sorted(entries, key=lambda e: (position.get(e.config_hash, len(position)), e.config_hash))
    else:
        entries = sorted(entries, key=lambda e: (e.benchmark.name, _order_key(e.order_label), e.seed, e.config_hash))
    benches: dict[str, list[Entry]] = {}
    bench_cfg: dict[str, dict] = {}
    for e in entries:
        key = canonical_json(e.config["benchmark"])
        benches.setdefault(key, []).append(e)
        bench_cfg[key] = {"benchmark": e.config["benchmark"]}
    keys = list(benches)
    bench_labels = disambiguate([bench_cfg[k]["benchmark"]["class_path"] for k in keys], [bench_cfg[k] for k in keys],
                                  "benchmark")
    tables = []
    for key, bench_label in zip(keys, bench_labels):
        groups: dict[str, list[Entry]] = {}
        configs: dict[str, dict] = {}
        for e in benches[key]:
            cfg = {k: v for k, v in e.config.items() if k not in _IGNORED and k != "benchmark"}
            gkey = canonical_json(cfg)
            groups.setdefault(gkey, []).append(e)
            configs[gkey] = cfg
        gkeys = list(groups)
        labels = disambiguate([display_name(configs[g]["strategy"]["class_path"]) for g in gkeys],
                               [configs[g] for g in gkeys], "strategy")
        rows = [Row(key=g, label=label, strategy=configs[g]["strategy"]["class_path"],
                    model=configs[g]["model"]["class_path"], entries=groups[g],
                    unranked=next((unranked[e.config_hash] for e in groups[g] if e.config_hash in unranked), None))
                for g, label in zip(gkeys, labels)]
        present = {s for e in benches[key] if e.ok for s, v in e.scores.items() if v is not None}
        higher = _directions(benches[key], bench_label, source)
        meta = _meta(benches[key])
        added = [s for s in meta if s in present and s not in SCORES and _metric_score(s)]
        scores = [s for s in SCORES if s in present] + added
        unit = replication_unit({e.order_label for e in benches[key] if e.ok})
        constant = constant_scores(benches[key])
        for row in rows:
            errors = [entry_score_stderr(e.document, wilson=True) for e in row.ok]
            for score in (s for s in scores if s not in constant):
                stat = summarize({(e.order_label, e.seed): (e.scores.get(score), se.get(score))
                                  for e, se in zip(row.ok, errors)}, unit, meta[score].bounds)
                if stat is not None:
                    row.stats[score] = stat
        _rank(rows, higher.get(RANK_BY, True))
        groups = table_groups(rows, higher.get(RANK_BY, True)) if RANK_BY in scores else None
        rows.sort(key=lambda r: (r.unranked is not None, r.rank is None, r.rank or 0, r.label))
        names: list[str] = []
        for e in benches[key]:
            for name in (e.r_metric.names or []) if e.ok else []:
                if name not in names:
                    names.append(name)
        scorings = sorted({s for e in benches[key] if e.ok and (s := scoring(e.objective))})
        tables.append(BenchmarkTable(key=key, name=bench_cfg[key]["benchmark"]["class_path"], label=bench_label,
                                     scores=scores, rows=rows, higher=higher, r_names=names, scorings=scorings,
                                     groups=groups, meta=meta, constant=constant))
    return tables


def unseen_scores(entry: OkEntry) -> list[float]:
    """R above the diagonal: each experience's score just before it was trained."""
    return [row[j + 1] for j, row in enumerate(entry.r_matrix[:-1])]


def constant_scores(entries: list[Entry]) -> list[str]:
    """Scores that say nothing about the method on these runs: FWT on a class-incremental stream
    where a shared head scores (next to) nothing on classes it has not trained, so that FWT is
    −mean(r_init) for every method, a property of the initialisation. FWT is the mean over
    experiences of R above the diagonal minus r_init; it is withheld where, in every sequential
    run, the first part (the mean of R above the diagonal) is smaller than the run's own FWT
    standard error from its test sets (exactly 0 where the run recorded none). Checked on the
    runs, not assumed from the scenario type: a method or model that does score unseen classes
    beyond that noise keeps the column."""
    runs = [e for e in entries if e.ok and not e.single_stage]
    if not runs or any(e.benchmark.scenario_type != "class-il" for e in runs):
        return []
    for e in runs:
        above = unseen_scores(e)
        if not above or sum(above) / len(above) > (entry_score_stderr(e.document).get("fwt") or 0.0):
            return []
    return ["fwt"]


def table_groups(rows: list[Row], higher: bool, score: str = RANK_BY) -> Groups:
    """Rank groups of ``rows`` on ``score`` (:func:`clbench.leaderboard.stats.rank_groups`)."""
    runs = {}
    for row in (r for r in rows if r.unranked is None):
        runs[row.label] = {(e.order_label, e.seed): (e.scores[score],
                                                     entry_score_stderr(e.document, wilson=True).get(score))
                           for e in row.ok if _finite(e.scores.get(score))}
    return rank_groups(runs, score, higher)
