"""Entries as the tables read them: typed records (:mod:`clbench.leaderboard.schema`) with the
defaults an older entry's missing record stands for, and a field of the wrong type refused in one
line that names it."""

from __future__ import annotations

import pytest
from helpers import fake_entry

from clbench.errors import UserError
from clbench.leaderboard import entries as E
from clbench.leaderboard.table import build_tables


def _write(root, entry: dict):
    entry["content_hash"] = E.content_hash(entry)
    return E.write_entry(root, entry)


def test_an_entry_is_read_typed_with_its_json_kept(tmp_path):
    written = fake_entry("replay", "default", 3, 0.7)
    written["env"].update(cpu={"model": "Test CPU", "isa": "AVX2", "pin": "avx2"}, torch_threads=2,
                          precision="bf16-mixed", packages={"torch": "2.9.0"})
    _write(tmp_path, written)
    (entry,) = E.load_entries(tmp_path)
    assert entry.ok and entry.seed == 3 and entry.order_label == "default" and entry.strategy.name == "replay"
    assert (entry.env.cpu.model, entry.env.cpu.isa, entry.env.cpu.pin) == ("Test CPU", "AVX2", "avx2")
    assert (entry.env.torch_threads, entry.env.precision, entry.env.packages["torch"]) == (2, "bf16-mixed", "2.9.0")
    assert entry.scores["acc"] == pytest.approx(0.7) and entry.compute.wall_seconds == 1.0
    assert entry.document == written  # the JSON as written, for what reads a runner's result whole


def test_records_an_older_entry_lacks_read_as_their_defaults(tmp_path):
    """An entry from before the CPU, precision, R's metric or the objective were recorded: the
    tables read accuracy, higher is better, no scoring, no CPU, and build as before."""
    old = fake_entry("naive", "default", 0, 0.5)
    for key in ("r_metric", "objective", "metrics", "single_stage"):
        old.pop(key, None)
    old["env"] = {"device": "cpu"}
    old["compute"] = {}
    _write(tmp_path, old)
    (entry,) = E.load_entries(tmp_path)
    assert entry.env.cpu is None and entry.env.precision is None and entry.env.git_dirty is False
    assert entry.r_metric.names is None and entry.r_metric.higher_is_better is True
    assert entry.objective.name is None and entry.objective.scoring is None
    assert entry.compute.wall_seconds is None and entry.matrices == {} and entry.recall_final is None
    (table,) = build_tables([entry])
    assert table.higher["acc"] is True and table.scorings == [] and table.rows[0].wall_seconds is None


@pytest.mark.parametrize("field, value, where", [
    ("env", {"device": "cpu", "cpu": "AVX2"}, "env.cpu"),
    ("env", {"device": "cpu", "git_dirty": "no"}, "env.git_dirty"),
    ("compute", {"wall_seconds": "fast"}, "compute.wall_seconds"),
    ("model", {"name": "mlp", "params_trainable": 1.5}, "model.params_trainable"),
    ("objective", {"name": "causal_lm", "scoring": 3}, "objective.scoring"),
])
def test_a_record_of_the_wrong_type_is_one_line_naming_the_field(tmp_path, field, value, where):
    entry = fake_entry("naive", "default", 0, 0.5)
    entry[field] = value
    path = _write(tmp_path, entry)
    with pytest.raises(UserError) as info:
        E.load_entries(tmp_path)
    line = info.value.one_line()
    assert f"{path}: {where}" in line and "\n" not in line
