"""TRACE (Wang et al. 2023, continual instruction tuning of LLMs) read from its published layout.

``<root>/<Task>/{train,eval,test}.json``, each file one JSON list of ``{"prompt": str,
"answer": str}`` objects, for the eight tasks C-STANCE, FOMC, MeetingBank, Py150, ScienceQA,
NumGLUE-cm, NumGLUE-ds and 20Minuten. ``root`` is the folder holding the task folders (or the
folder just above it). Only ``train.json`` and the test file (``test.json``, or ``eval.json``
with ``test_split="eval"``) are read.

Every experience is one task; its datasets yield ``{"prompt", "answer"}`` dicts. The stream is
scored by the ``causal_lm`` objective with TRACE's metric per task, in one of two scorings
(:data:`clbench.metrics.text.TRACE_SCORINGS`): ``scoring="trace"`` (the default) computes each
task's score exactly as the TRACE repository's evaluation scripts do, on the generation as
decoded, so numbers compare with published ones; ``scoring="normalized"`` is the project's
lenient form (stripped answers, the first non-blank character for letter answers, ROUGE-L on
lower-cased word tokens, the unrounded-input indel ratio). ``docs/language-models.md`` tabulates both.

Scenario type: ``domain-il`` by default. TRACE's protocol (as the MH-MoE paper runs it) gives
no task id at inference: the task is only implicit in the prompt's instruction, and every task
answers in the same output space (token strings). ``scenario_type="task-il"`` declares a
protocol where methods may use the task id at test time (MoSEs' "TIL" tables).

Orders: ``standard`` (= ``default``, TRACE's scripts) and ``order1``..``order3`` of the MH-MoE
paper (appendix A.3.4); with a subset of tasks, each named order keeps its relative order.
Seeded subsampling: ``n_train``/``n_test`` records per task (TRACE-0.5K of the MoSEs paper is
500/100), drawn without replacement by a generator seeded from ``(subsample_seed, task)``, so a
task's subsample does not depend on which other tasks are in the stream.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence, get_args

import numpy as np
from pydantic import AfterValidator, Field
from torch.utils.data import Dataset

from clbench.errors import UserError
from clbench.config.validation import distinct

TASKS = ("C-STANCE", "FOMC", "MeetingBank", "Py150", "ScienceQA", "NumGLUE-cm", "NumGLUE-ds", "20Minuten")
#: MH-MoE paper, appendix A.3.4 ("standard" is TRACE's default order).
ORDERS: dict[str, tuple[str, ...]] = {
    "standard": TASKS,
    "order1": ("FOMC", "C-STANCE", "ScienceQA", "Py150", "MeetingBank", "NumGLUE-cm", "NumGLUE-ds", "20Minuten"),
    "order2": ("FOMC", "C-STANCE", "ScienceQA", "Py150", "NumGLUE-ds", "NumGLUE-cm", "MeetingBank", "20Minuten"),
    "order3": ("FOMC", "C-STANCE", "ScienceQA", "Py150", "MeetingBank", "NumGLUE-ds", "NumGLUE-cm", "20Minuten"),
}
SPLITS = ("train", "eval", "test")
KEYS = ("prompt", "answer")
# The arguments TRACE streams declare (checked from the config).
Tasks = Annotated[list[Literal[TASKS]], Field(min_length=1), AfterValidator(distinct)]
Scoring = Literal["trace", "normalized"]
SCORINGS = get_args(Scoring)
ScenarioType = Literal["domain-il", "task-il"]
FIX = 'each file must be a JSON list of {"prompt": "...", "answer": "..."} objects; re-extract the TRACE archive ' \
      "(see docs/datasets.md)"


class TextRecords(Dataset):
    """One split's ``{"prompt", "answer"}`` records, held in memory; each item is a new dict."""

    def __init__(self, records: Sequence[dict[str, str]], source: str | None = None):
        self.prompts = [r["prompt"] for r in records]
        self.answers = [r["answer"] for r in records]
        self.source = source  # the file the records came from, for messages

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: int) -> dict[str, str]:
        return {"prompt": self.prompts[index], "answer": self.answers[index]}

    def records(self) -> list[dict[str, str]]:
        return [self[i] for i in range(len(self))]


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def _locate_record(text: str, position: int | None = None) -> tuple[int | None, str | None]:
    """(index of the top-level record that fails to parse, or that holds ``position``; the
    parse error) by reading the list one record at a time."""
    decoder = json.JSONDecoder()
    ws = re.compile(r"\s*")
    i = ws.match(text, 0).end()
    if not text.startswith("[", i):
        return None, None
    i = ws.match(text, i + 1).end()
    index = 0
    if text.startswith("]", i):
        return None, None
    while True:
        start = i
        try:
            _, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as err:
            return index, f"{err.msg} (line {err.lineno}, column {err.colno})"
        if position is not None and start <= position < i:
            return index, None
        i = ws.match(text, i).end()
        if text.startswith(",", i):
            i = ws.match(text, i + 1).end()
            index += 1
        elif text.startswith("]", i):
            return None, None
        else:
            line = text.count("\n", 0, i) + 1
            return index, f"expected ',' or ']' after the record (line {line})"


def read_split(path: str | Path) -> list[dict[str, str]]:
    """The records of one TRACE file, or a one-line :class:`UserError` naming the file and the
    record (missing key, wrong type, not a list, empty file, invalid JSON or UTF-8)."""
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise UserError("file missing" if not path.exists() else "not a file", where=where, fix=FIX)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise UserError(f"cannot read the file ({err.strerror})", where=where, fix="check its permissions") from None
    if not raw.strip():
        raise UserError("the file is empty", where=where, fix=FIX)
    bad_utf8 = None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        bad_utf8 = err
        text = raw.decode("utf-8-sig", errors="surrogateescape")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        index, detail = _locate_record(text)
        if index is None:
            raise UserError(f"not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})",
                            where=where, fix=FIX) from None
        raise UserError(f"record {index}: not valid JSON: {detail}", where=where, fix=FIX) from None
    if bad_utf8 is not None:
        offset = bad_utf8.start + (3 if raw.startswith(b"\xef\xbb\xbf") else 0)  # the codec skips the BOM
        index, _ = _locate_record(text, _char_position(raw, offset))
        at = f"record {index}: " if index is not None else ""
        raise UserError(f"{at}not valid UTF-8 (byte 0x{raw[offset]:02x} at offset {offset})", where=where,
                        fix="TRACE files are UTF-8; re-extract the archive or re-save the file as UTF-8")
    if not isinstance(data, list):
        hint = " (JSON Lines? TRACE files hold one JSON list)" if isinstance(data, dict) else ""
        raise UserError(f"expected a JSON list of records, found {_kind(data)}{hint}", where=where, fix=FIX)
    if not data:
        raise UserError("the list holds no records", where=where, fix=FIX)
    for i, record in enumerate(data):
        if not isinstance(record, dict):
            raise UserError(f"record {i}: expected an object with 'prompt' and 'answer', found {_kind(record)}",
                            where=where, fix=FIX)
        for key in KEYS:
            if key not in record:
                raise UserError(f"record {i}: no '{key}' key", where=where, fix=FIX)
            if not isinstance(record[key], str):
                raise UserError(f"record {i}: '{key}' is {_kind(record[key])}, expected a string",
                                where=where, fix=FIX)
    return [{"prompt": r["prompt"], "answer": r["answer"]} for r in data]


def _char_position(raw: bytes, byte_offset: int) -> int:
    """Index in the surrogate-escaped text of the character at ``byte_offset`` of ``raw``."""
    head = raw[:byte_offset]
    skip = 3 if head.startswith(b"\xef\xbb\xbf") else 0
    return len(head[skip:].decode("utf-8", errors="surrogateescape"))


def in_order(tasks: Sequence[str] | None) -> list[str]:
    """The requested tasks (all by default) in TRACE's standard order."""
    return list(TASKS) if tasks is None else [t for t in TASKS if t in tasks]


def locate(root: str | Path, tasks: Sequence[str]) -> dict[str, Path]:
    """Each task's folder under ``root`` (or under its single subfolder that holds them); task
    folders match case-insensitively. A missing folder is named."""
    base = Path(root).expanduser()
    if not base.is_dir():
        raise UserError("TRACE root does not exist" if not base.exists() else "TRACE root is not a folder",
                        where=str(base), fix="point root at the folder holding C-STANCE/, FOMC/, ... "
                                             "(see docs/datasets.md)")

    def folders(place: Path) -> dict[str, Path]:
        by_name = {p.name.lower(): p for p in place.iterdir() if p.is_dir()}
        return {t: by_name[t.lower()] for t in tasks if t.lower() in by_name}

    found = folders(base)
    if not found:
        inner = [p for p in base.iterdir() if p.is_dir() and folders(p)]
        if len(inner) == 1:
            base, found = inner[0], folders(inner[0])
    missing = [t for t in tasks if t not in found]
    if missing:
        more = f" (and {len(missing) - 1} more: {', '.join(missing[1:])})" if len(missing) > 1 else ""
        raise UserError(f"TRACE task folder missing{more}", where=str(base / missing[0]),
                        fix="point root at the folder holding the task folders, "
                            "or leave the task out with tasks: [...]")
    return found


def subsample(records: list[dict[str, str]], n: int | None, seed: int, task: str, split: str,
              where: str, field: str) -> list[dict[str, str]]:
    """``n`` records drawn without replacement (kept in file order), seeded by (seed, task, split)."""
    if n is None or n == len(records):
        return records
    if n > len(records):
        raise UserError(f"{field}={n} but the file holds {len(records)} records", where=where,
                        fix=f"lower {field} or set it to null to use every record")
    rng = np.random.default_rng([int(seed), TASKS.index(task) if task in TASKS else 99, SPLITS.index(split)])
    keep = np.sort(rng.choice(len(records), size=n, replace=False))
    return [records[i] for i in keep]


def scenario_from_records(name: str, data: dict[str, tuple[list[dict], list[dict]]], *,
                          scenario_type: ScenarioType = "domain-il", sources: dict[str, tuple[str, str]] | None = None,
                          scoring: Scoring = "trace", synthetic: bool = False):
    """The Avalanche scenario of a TRACE-style stream: ``data`` maps each task (in stream
    order) to its (train, test) records; ``scoring`` picks the task metrics; ``synthetic``: the
    records were generated, not TRACE's (:attr:`clbench.data.streams.StreamSpec.synthetic`)."""
    from clbench.metrics.text import TRACE_SCORINGS
    from clbench.data.streams import StreamSpec, build_scenario

    metrics = TRACE_SCORINGS[scoring]
    tasks = list(data)
    sources = sources or {}
    train = [TextRecords(data[t][0], sources.get(t, (None, None))[0]) for t in tasks]
    test = [TextRecords(data[t][1], sources.get(t, (None, None))[1]) for t in tasks]
    orders = {k: [t for t in order if t in data] for k, order in ORDERS.items()}
    spec = StreamSpec(name=name, scenario_type=scenario_type, named_orders=orders, objective="causal_lm",
                      objective_args={"task_metrics": {t: metrics[t] for t in tasks}}, synthetic=synthetic)
    return build_scenario(spec, train, test, names=tasks, targets=False,
                          domain_ids=[TASKS.index(t) if t in TASKS else i for i, t in enumerate(tasks)])


def trace(root: str, tasks: Tasks | None = None, n_train: Annotated[int, Field(ge=1)] | None = None,
          n_test: Annotated[int, Field(ge=1)] | None = None, subsample_seed: int = 0,
          test_split: Literal["test", "eval"] = "test", scenario_type: ScenarioType = "domain-il",
          scoring: Scoring = "trace"):
    """TRACE from ``root``: one experience per task (all 8, or ``tasks``), trained on
    ``train.json`` and tested on ``test.json`` (or ``eval.json``), optionally subsampled, and
    scored by ``scoring`` (``trace``: TRACE's own evaluation; ``normalized``: lenient).
    ``n_train``/``n_test``: records per task (null: all; TRACE-0.5K is 500/100)."""
    names = in_order(tasks)
    folders = locate(root, names)
    data, sources = {}, {}
    for task in names:
        train_file, test_file = folders[task] / "train.json", folders[task] / f"{test_split}.json"
        train = subsample(read_split(train_file), n_train, subsample_seed, task, "train", str(train_file), "n_train")
        test = subsample(read_split(test_file), n_test, subsample_seed, task, test_split, str(test_file), "n_test")
        data[task] = (train, test)
        sources[task] = (str(train_file), str(test_file))
    return scenario_from_records("trace", data, scenario_type=scenario_type, sources=sources, scoring=scoring)


trace.objective = "causal_lm"  # the stream's objective, known before it is built (preflight)


def write_trace(root: str | Path, data: dict[str, dict[str, list[dict[str, str]]]]) -> Path:
    """Write ``{task: {split: records}}`` as ``root/<task>/<split>.json`` (TRACE's layout:
    UTF-8, one JSON list per file, non-ASCII kept as is); returns ``root``."""
    root = Path(root)
    for task, splits in data.items():
        folder = root / task
        folder.mkdir(parents=True, exist_ok=True)
        for split, records in splits.items():
            with open(folder / f"{split}.json", "w", encoding="utf-8") as f:
                json.dump(records, f, ensure_ascii=False, indent=1)
    return root
