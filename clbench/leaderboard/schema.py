"""The fields of a leaderboard entry and their types, as pydantic models.

:func:`~clbench.leaderboard.entries.verify_entry` validates every entry it reads against
:class:`Entry` (any status) or :class:`OkEntry` (a finished run), so that a reader never meets a
missing field, a status outside :class:`~clbench.results.record.Status` or a field of the wrong type
(a seed that is not an integer, a strategy without a name) as a traceback. The numbers of an
ok entry (``r_matrix``, ``r_init``, ``scores``, ``matrices``, ...) are checked, and every score
recomputed, by :mod:`~clbench.leaderboard.rescore`. Fields not named here are allowed and kept
as they are (the result's other records, e.g. expert utilization). The JSON is unchanged: these
models describe the entries written since ``entry_schema`` 1.

A verified entry is read as one of these models (:func:`~clbench.leaderboard.entries.load_entries`):
tables, pages and ``compare`` read its fields as attributes, typed, with the defaults an
older entry's missing record stands for; :attr:`Entry.document` is the JSON as it was read, for
what works on a runner's result as a whole (standard errors, R's figures).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictBool, StrictInt, StrictStr, ValidationError

from clbench.errors import UserError
from clbench.results.record import Status


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Named(_Open):
    """``benchmark``, ``model`` or ``strategy``: a name, and what else the run recorded."""

    name: StrictStr


class BenchmarkRecord(Named):
    """The stream a run trained on (absent fields: a failed run's, which built no stream)."""

    init_args: dict[str, Any] = Field(default_factory=dict)
    scenario_type: StrictStr | None = None
    num_classes: StrictInt | None = None
    synthetic: StrictBool = False  # the stream's data was generated (StreamSpec.synthetic)


class ModelRecord(Named):
    params_trainable: StrictInt | None = None


class Execution(_Open):
    """How the run's process ran: the torch threads a rerun is given (absent: the suite's rule)."""

    torch_threads: StrictInt | None = Field(default=None, ge=1)


class Harness(_Open):
    version: StrictStr | None = None
    git_commit: StrictStr | None = None


class CpuRecord(_Open):
    """The CPU a run computed on (:func:`clbench.results.assemble.cpu_identity`)."""

    model: StrictStr | None = None
    isa: StrictStr | None = None
    pin: StrictStr | None = None  # the kernel level the run pinned (clbench.cpu_kernels), if any
    vendor: StrictStr | None = None  # GenuineIntel, AuthenticAMD; None: recorded before it was


class Environment(_Open):
    """Where a run computed (:func:`clbench.results.assemble.environment`); entries older than a
    field leave it None."""

    device: StrictStr | None = None
    cuda: StrictStr | None = None
    cpu: CpuRecord | None = None
    torch_threads: StrictInt | None = None
    precision: StrictStr | None = None  # the Trainer's; None: written before it was recorded (float32)
    packages: dict[str, StrictStr | None] = Field(default_factory=dict)
    git_dirty: StrictBool = False


class Compute(_Open):
    wall_seconds: float | None = None


class RMetric(_Open):
    """R's metric per column and its direction (no record: accuracy, higher is better)."""

    names: list[StrictStr] | None = None
    higher_is_better: StrictBool = True


class ObjectiveRecord(_Open):
    name: StrictStr | None = None
    scoring: StrictStr | None = None  # generated text: trace, normalized or mixed


class Entry(_Open):
    """What every entry holds, whatever its status."""

    entry_schema: StrictInt = Field(ge=1)
    status: Status
    error: StrictStr | None
    config: dict[str, Any]
    config_hash: StrictStr
    content_hash: StrictStr
    harness: Harness
    execution: Execution
    benchmark: BenchmarkRecord
    model: ModelRecord
    strategy: Named
    seed: StrictInt
    order: Any
    order_label: StrictStr
    env: Environment
    compute: Compute
    suite: StrictStr | None = None
    _document: dict = PrivateAttr(default_factory=dict)

    @property
    def document(self) -> dict:
        """The entry's JSON as it was read and verified (a runner's result, for its readers)."""
        return self._document

    @property
    def ok(self) -> bool:
        return self.status == Status.OK


class MetricInfo(_Open):
    """What a run recorded of one evaluation metric (:func:`clbench.metrics.declared.describe`)."""

    title: StrictStr
    higher_is_better: StrictBool
    percent: StrictBool


class OkEntry(Entry):
    """A finished run's entry: the runner's result on top (its numbers are checked by re-scoring)."""

    result_schema: StrictInt = Field(alias="schema", ge=1)
    experiences: list[StrictStr]
    r_metric: RMetric = Field(default_factory=RMetric)
    objective: ObjectiveRecord = Field(default_factory=ObjectiveRecord)
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
    # after the last stage, each class's recall per test experience and on the stream-wide test set
    recall_final: dict[str, Any] | None = None
    matrices: dict[str, Any] = Field(default_factory=dict)
    expert_utilization: list[Any] | None = None

    @property
    def recorded_metrics(self) -> dict[str, dict[str, Any]] | None:
        """``metrics`` as recorded (each metric's title, direction, unit and class), for
        :mod:`clbench.metrics.score_registry`."""
        return self.document.get("metrics")


def _path(loc: tuple) -> str:
    return ".".join(str(part) for part in loc)


def validate_entry(entry: dict, where: str, fix: str) -> Entry:
    """``entry`` as its typed model (:class:`OkEntry` for a finished run); refused, in one line
    naming the field, if it misses a field or holds one of the wrong type."""
    model = OkEntry if entry.get("status") == Status.OK else Entry
    try:
        typed = model.model_validate(entry)
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
    typed._document = entry
    return typed
