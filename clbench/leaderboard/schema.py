"""The fields of a leaderboard entry and their types, as pydantic models.

:func:`~clbench.leaderboard.entries.verify_entry` validates every entry it reads against
:class:`Entry` (any status) or :class:`OkEntry` (a finished run), so that a reader never meets a
missing field, a status outside :class:`~clbench.results.record.Status` or a field of the wrong type
(a seed that is not an integer, a strategy without a name) as a traceback. The numbers of an
ok entry (``r_matrix``, ``r_init``, ``scores``, ``matrices``, ...) are checked, and every score
recomputed, by :mod:`~clbench.leaderboard.rescore`. Fields not named here are allowed and kept
as they are (the result's other records, e.g. expert utilization). The JSON is unchanged: these
models describe the entries written since ``entry_schema`` 1.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from clbench.errors import UserError
from clbench.results.record import Status


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Named(_Open):
    """``benchmark``, ``model`` or ``strategy``: a name, and what else the run recorded."""

    name: StrictStr


class Execution(_Open):
    """How the run's process ran: the torch threads a rerun is given (absent: the suite's rule)."""

    torch_threads: StrictInt | None = Field(default=None, ge=1)


class Entry(_Open):
    """What every entry holds, whatever its status."""

    entry_schema: StrictInt = Field(ge=1)
    status: Status
    error: StrictStr | None
    config: dict[str, Any]
    config_hash: StrictStr
    content_hash: StrictStr
    harness: dict[str, Any]
    execution: Execution
    benchmark: Named
    model: Named
    strategy: Named
    seed: StrictInt
    order: Any
    order_label: StrictStr
    env: dict[str, Any]
    compute: dict[str, Any]


class MetricInfo(_Open):
    """What a run recorded of one evaluation metric (:func:`clbench.metrics.declared.describe`)."""

    title: StrictStr
    higher_is_better: StrictBool
    percent: StrictBool


class OkEntry(Entry):
    """A finished run's entry: the runner's result on top (its numbers are checked by re-scoring)."""

    result_schema: StrictInt = Field(alias="schema", ge=1)
    experiences: list[StrictStr]
    r_matrix: list[Any]
    r_init: list[Any]
    scores: dict[str, Any]
    single_stage: StrictBool | None = None
    # result schema 2: the test sets' noise (clbench.metrics.stderr); absent in older entries: unknown
    r_stderr: list[Any] | None = None
    r_init_stderr: list[Any] | None = None
    r_n: list[Any] | None = None
    scores_stderr: dict[str, Any] | None = None
    # each evaluation metric's title, direction and unit; absent in older entries (built-in metrics only)
    metrics: dict[str, MetricInfo] | None = None


def _path(loc: tuple) -> str:
    return ".".join(str(part) for part in loc)


def validate_entry(entry: dict, where: str, fix: str) -> None:
    """Refuse (one line naming the field) an entry that misses a field or holds one of the wrong type."""
    model = OkEntry if entry.get("status") == Status.OK else Entry
    try:
        model.model_validate(entry)
    except ValidationError as err:
        errors = err.errors()
        missing = [_path(e["loc"]) for e in errors if e["type"] == "missing"]
        if missing:
            raise UserError(f"missing field(s) {', '.join(missing)}", where=where, fix=fix) from None
        first = errors[0]
        field = _path(first["loc"])
        if field == "status":
            raise UserError(f"unknown status {entry['status']!r} (expected one of: {', '.join(Status)})",
                            where=f"{where}: status", fix=fix) from None
        raise UserError(f"{first['msg'][0].lower()}{first['msg'][1:]}, got {first['input']!r}"[:300],
                        where=f"{where}: {field}", fix=fix) from None
