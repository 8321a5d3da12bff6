"""A stream described without its data (``clbench.data.description``): what a saved model is
rebuilt from. It round-trips, takes NumPy counts as ints, gives way to the data where a plugin's
stream holds what JSON cannot, and refuses an altered description in one line."""

from __future__ import annotations

import numpy as np
import pytest

from clbench.data.description import describe, read
from clbench.data.streams import Experience, StreamSpec
from clbench.errors import UserError


def _experiences() -> list[Experience]:
    return [Experience(position=k, name=f"t{k}", domain_id=np.int64(k), classes=[np.int64(2 * k), 2 * k + 1],
                       train=None, test=None) for k in range(2)]


def test_a_description_round_trips_with_numpy_counts_read_as_ints():
    spec = StreamSpec(name="s", num_classes=np.int64(4), input_shape=(1, np.int64(8), 8), scenario_type="task-il",
                      class_names=["a", "b", "c", "d"], objective_args={"task_metrics": {"t0": "acc"}})
    described = describe(spec, _experiences())
    back, experiences = read(described, "model.json", "fix")
    assert back.num_classes == 4 and back.input_shape == (1, 8, 8) and back.objective_args == spec.objective_args
    assert [(e.position, e.name, e.domain_id, e.classes, e.train) for e in experiences] == \
        [(0, "t0", 0, [0, 1], None), (1, "t1", 1, [2, 3], None)]


def test_a_stream_json_cannot_hold_is_not_described():
    assert describe(StreamSpec(name="s", objective_args={"tokenizer": object()}), _experiences()) is None


@pytest.mark.parametrize("change, field", [
    (lambda d: d["experiences"][1].update(position=5), "stream.experiences: positions"),
    (lambda d: d.update(scenario_type="weird"), "stream.scenario_type"),
    (lambda d: d.update(extra=1), "stream.extra"),
])
def test_an_altered_description_is_one_line(change, field):
    described = describe(StreamSpec(name="s", num_classes=4), _experiences())
    change(described)
    with pytest.raises(UserError) as err:
        read(described, "run/model/final/model.json", "copy the folder again")
    assert field in str(err.value) and "\n" not in str(err.value)
