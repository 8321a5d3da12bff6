"""What a run's record (``result.json``, a leaderboard entry) says about the run itself.

* :class:`Status`: the closed set of an entry's ``status``.
* :func:`single_stage`: whether the run trained once on the whole stream (joint training: one
  row of R) rather than experience by experience. Runs record it (``single_stage``); for
  entries written before they did, it is inferred here, and only here, from what they hold.

Only the standard library is imported, so every reader can use it.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Mapping


class Status(str, Enum):
    """An entry's ``status``; a ``str``, so it compares equal to, prints and serializes as its JSON string."""

    OK = "ok"  # the run finished: the entry holds its result
    FAILED = "failed"  # the run stopped with the one-line ``error``; counted, never averaged

    __str__ = str.__str__
    __format__ = str.__format__


def single_stage(record: Mapping[str, Any]) -> bool:
    """Whether the run was single-stage (joint training), as recorded in its ``single_stage``.

    A record without the field (written before runs recorded it) is single-stage when R has one
    row and either several columns or not every CL score: a continual run over a one-experience
    stream has one row too, but reports every CL score, while a single-stage run reports only
    ``acc`` and nulls for the stage-comparing ones.
    """
    recorded = record.get("single_stage")
    if isinstance(recorded, bool):
        return recorded
    from clbench.metrics.scores import SCORE_KEYS

    r = record.get("r_matrix")
    if not isinstance(r, list) or len(r) != 1 or not isinstance(r[0], list):
        return False
    scores = record.get("scores")
    return len(r[0]) > 1 or not (isinstance(scores, dict) and set(SCORE_KEYS) <= set(scores))
