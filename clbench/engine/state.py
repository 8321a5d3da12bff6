"""What the loop has produced so far: the state every checkpoint stores and a result is made of."""

from __future__ import annotations

from dataclasses import dataclass, field

@dataclass
class RunState:
    """What the loop has produced so far; stored in every checkpoint as a plain dict.

    A row is ``{metric: [value per column]}`` with ``"primary"`` the R-matrix entries.
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
    # the last stage's per-class recall: {"columns": [per experience], "global": [...] or None}
    recall: dict | None = None

    @classmethod
    def from_dict(cls, values: dict) -> "RunState":
        known = {k: v for k, v in values.items() if k in cls.__dataclass_fields__}
        return cls(**known)
