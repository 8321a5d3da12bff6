"""A stream described without its data: what a model and a strategy are built from.

A run's saved weights (:mod:`clbench.engine.saved`) keep this description beside its config,
so :func:`clbench.load_model` rebuilds the model, and replays the strategy's structural changes,
with no dataset on disk: the stream's :class:`~clbench.data.streams.StreamSpec` (less its
stream-wide test set) and every experience's position, name, domain and classes, in run order.

The description is read from a folder someone may have sent, so every field is checked
(pydantic, extra fields refused) before anything is built from it.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clbench.data.streams import SCENARIO_TYPES, Experience, StreamSpec
from clbench.errors import UserError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class DescribedExperience(_Strict):
    position: int = Field(ge=0)
    name: str
    domain_id: int = Field(ge=0)
    classes: list[int]


class StreamDescription(_Strict):
    name: str
    num_classes: int | None = Field(default=None, ge=1)
    input_shape: list[int] | None = None
    scenario_type: Literal[SCENARIO_TYPES]  # type: ignore[valid-type]
    named_orders: dict[str, list[str]] = {}
    class_names: list[str] | None = None
    objective: str
    objective_args: dict[str, Any] = {}
    imbalance_metrics: bool = False
    synthetic: bool = False
    experiences: list[DescribedExperience] = Field(min_length=1)


def describe(spec: StreamSpec, experiences: list[Experience]) -> dict | None:
    """The JSON description of a stream, or None when a plugin's stream holds what JSON cannot
    (objects in its objective arguments, names that are not text): its model then loads with
    the data, as before streams were described. Numbers are taken as Python ints (a stream may
    count its classes with NumPy)."""
    try:
        args = json.loads(json.dumps(spec.objective_args, allow_nan=False))
        return StreamDescription(
            name=spec.name, num_classes=None if spec.num_classes is None else int(spec.num_classes),
            input_shape=None if spec.input_shape is None else [int(d) for d in spec.input_shape],
            scenario_type=spec.scenario_type, named_orders={k: list(v) for k, v in spec.named_orders.items()},
            class_names=None if spec.class_names is None else list(spec.class_names), objective=spec.objective,
            objective_args=args, imbalance_metrics=bool(spec.imbalance_metrics), synthetic=bool(spec.synthetic),
            experiences=[DescribedExperience(position=int(e.position), name=e.name, domain_id=int(e.domain_id),
                                             classes=[int(c) for c in e.classes]) for e in experiences],
        ).model_dump()
    except (TypeError, ValueError):  # pydantic's ValidationError is a ValueError
        return None


def read(value: Any, where: str, fix: str) -> tuple[StreamSpec, list[Experience]]:
    """The spec and the data-free experiences (``train``/``test`` None) a description holds."""
    try:
        described = StreamDescription.model_validate(value)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise UserError(f"stream.{field}: {first['msg'].lower()}", where=where, fix=fix) from None
    if [e.position for e in described.experiences] != list(range(len(described.experiences))):
        raise UserError("stream.experiences: positions are not 0, 1, ... in order", where=where, fix=fix)
    spec = StreamSpec(name=described.name, num_classes=described.num_classes,
                      input_shape=tuple(described.input_shape) if described.input_shape is not None else None,
                      scenario_type=described.scenario_type, named_orders=described.named_orders,
                      class_names=described.class_names, objective=described.objective,
                      objective_args=described.objective_args, imbalance_metrics=described.imbalance_metrics,
                      synthetic=described.synthetic)
    experiences = [Experience(position=e.position, name=e.name, domain_id=e.domain_id, classes=e.classes,
                              train=None, test=None) for e in described.experiences]
    return spec, experiences
