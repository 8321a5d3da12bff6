"""What the loop has produced so far: the state every checkpoint stores and a result is made of."""

from __future__ import annotations

from dataclasses import dataclass, field

# The keys a pass's values shared with the metrics' names before they had fields of their own:
# checkpoints written then are still read (RunState.from_dict).
_FIXED_KEYS = ("primary", "primary_stderr", "primary_n")


@dataclass
class ColumnValues:
    """What a pass measured, one value per evaluated set (or, once split by
    :class:`~clbench.engine.columns.EvalColumns`, per experience): ``primary`` is each set's R
    entry, ``stderr`` and ``n`` its standard error and test-set size (:mod:`clbench.metrics.stderr`;
    None where the metric gives none), ``metrics`` every metric by name (None where a set has no
    such metric). The run's state stores it as a plain dict (``asdict``)."""

    primary: list
    stderr: list
    n: list
    metrics: dict[str, list]

    @classmethod
    def from_dict(cls, values: dict) -> "ColumnValues":
        """From the run's state; a row of a checkpoint written when the fixed keys shared the
        metrics' mapping (``primary``, ``primary_stderr``, ``primary_n`` among the names) too."""
        if "metrics" in values:
            return cls(**values)
        missing = [None] * len(values["primary"])
        return cls(primary=values["primary"], stderr=values.get("primary_stderr") or missing,
                   n=values.get("primary_n") or missing,
                   metrics={k: v for k, v in values.items() if k not in _FIXED_KEYS})


@dataclass
class RunState:
    """What the loop has produced so far; stored in every checkpoint as a plain dict.

    A row (``rows``, ``epoch_rows``, ``r_init``) is a :class:`ColumnValues`
    as a dict: ``primary`` (R's entries), ``stderr``, ``n`` and ``metrics`` (``{name: [value per
    column]}``); ``global_rows`` and ``global_init`` are the stream-wide test set's ``{name: value}``.
    """

    stage: int = 0
    rows: list[dict] = field(default_factory=list)
    global_rows: list[dict] = field(default_factory=list)
    epoch_rows: list[dict] = field(default_factory=list)
    epoch_stage: list[int] = field(default_factory=list)
    r_init: dict | None = None
    global_init: dict | None = None
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    wall_seconds: float = 0.0
    resumes: int = 0
    routing: list[dict] = field(default_factory=list)
    train_routing: list[dict] = field(default_factory=list)
    pretrain: dict | None = None  # clbench.engine.pretrain's record, once the held-out subset has trained
    compositions: list[dict] = field(default_factory=list)
    routing_metrics: list[dict] = field(default_factory=list)  # per stage: each declared routing metric's value
    # the last stage's per-class recall: {"columns": [per experience], "global": [...] or None}
    recall: dict | None = None

    @classmethod
    def from_dict(cls, values: dict) -> "RunState":
        """From a checkpoint's dict; rows written before the fixed keys had their own fields are
        read too (:meth:`ColumnValues.from_dict`)."""
        from dataclasses import asdict

        known = {k: v for k, v in values.items() if k in cls.__dataclass_fields__}
        for key in ("rows", "epoch_rows"):
            known[key] = [asdict(ColumnValues.from_dict(row)) for row in known.get(key, [])]
        if known.get("r_init") is not None:
            known["r_init"] = asdict(ColumnValues.from_dict(known["r_init"]))
        known["global_rows"] = [_metrics_only(row) for row in known.get("global_rows", [])]
        if known.get("global_init"):
            known["global_init"] = _metrics_only(known["global_init"])
        return cls(**known)


def _metrics_only(values: dict) -> dict:
    return {k: v for k, v in values.items() if k not in _FIXED_KEYS}
