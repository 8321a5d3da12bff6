"""A routing-derived metric added from a plugin file: declared with ``clbench.metrics.declare_routing``
on a strategy outside the package, it is computed after every evaluation pass, recorded in
result.json (per stage, its score and what it is), re-scored, shown in a leaderboard table with
its declared title and direction, and compared across task orders; no file of the package changes."""

from __future__ import annotations

import copy
import math

import pytest
from helpers import tiny_config, typed_entries

from clbench.errors import UserError

PLUGIN = '''
from clbench.metrics import declare_routing
from clbench.strategies.naive import Naive
from clbench.strategies.replay import Replay


def top_share(routing):
    """The largest share one expert takes of a domain's test units, averaged over layers and domains."""
    shares = [max(row) for layer in routing.utilization.values() for row in layer["utilization"]
              if all(v == v for v in row)]
    return sum(shares) / len(shares) if shares else None


TOP_SHARE = declare_routing("top_share", top_share, title="Top-expert share", higher_is_better=False,
                            percent=True)


class WatchedNaive(Naive):
    extra_metrics = (TOP_SHARE,)


class WatchedReplay(Replay):
    extra_metrics = (TOP_SHARE,)
'''

VIT = {"class_path": "vit_moe", "init_args": {"label": "MoE", "patch_size": 4, "embed_dim": 16, "depth": 2,
                                              "num_heads": 2, "mlp_ratio": 2.0, "moe_blocks": [0, 1]}}


def _top_share(figures: dict) -> float:
    """The same quantity recomputed from the figures result.json records per stage."""
    shares = [max(row) for layer in figures.values() for row in layer["utilization"]
              if all(v is not None and not math.isnan(v) for v in row)]
    return sum(shares) / len(shares)


@pytest.fixture(scope="module")
def entries(tmp_path_factory):
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run
    from clbench.leaderboard.entries import entry_from_result

    folder = tmp_path_factory.mktemp("routing-plugin")
    plugin = folder / "watched.py"
    plugin.write_text(PLUGIN)
    made = []
    for name in ("WatchedNaive", "WatchedReplay"):
        for order in ("default", "reverse"):
            cfg = resolve_config(tiny_config(model=VIT, order=order, strategy={"class_path": f"{plugin}:{name}"},
                                             benchmark={"init_args": {"domains": ["rot0", "rot90"]}}))
            made.append(entry_from_result(run(cfg)))
    return made


def test_the_metric_is_recorded_per_stage_with_its_score_and_declaration(entries):
    for entry in entries:
        values = entry["routing_metrics"]["top_share"]
        assert len(values) == 2 == len(entry["expert_utilization"])
        # the value of each stage is the plugin's function of that stage's recorded figures
        assert values == pytest.approx([_top_share(f) for f in entry["expert_utilization"]], rel=1e-6)
        assert all(0 < v <= 1 for v in values)
        assert entry["scores"]["top_share_final"] == values[-1]
        assert entry["metrics"]["top_share"] == {"title": "Top-expert share", "higher_is_better": False,
                                                 "percent": True, "class": entry["metrics"]["top_share"]["class"],
                                                 "routing": True}
        assert entry["metrics"]["top_share"]["class"].endswith(":top_share")


def test_the_score_is_rescored_and_an_edit_is_refused(entries):
    from clbench.leaderboard.rescore import check_scores

    check_scores(entries[0], "entry.json")
    edited = copy.deepcopy(entries[0])
    edited["routing_metrics"]["top_share"][-1] = 0.5 * edited["routing_metrics"]["top_share"][-1]
    with pytest.raises(UserError, match="score 'top_share_final'"):
        check_scores(edited, "entry.json")


def test_a_table_shows_it_with_its_title_and_direction_and_compare_reads_it(entries):
    from clbench.leaderboard.compare import compare
    from clbench.leaderboard.table import build_tables

    (table,) = build_tables(typed_entries(entries))
    assert "top_share_final" in table.scores
    assert table.meta["top_share_final"].title == "Top-expert share"
    assert table.higher["top_share_final"] is False
    assert len([row for row in table.rows if "top_share_final" in row.stats]) == 2

    report = compare(typed_entries(entries), metric="top_share_final")
    assert report["higher_is_better"] is False and report["percent"] is True
    (bench,) = report["benchmarks"]
    per_order = {s["strategy"]: s["per_order"] for s in bench["strategies"]}
    assert len(per_order) == 2
    for entry in entries:
        assert per_order[entry["strategy"]["name"]][entry["order_label"]] == \
            pytest.approx(entry["scores"]["top_share_final"])
