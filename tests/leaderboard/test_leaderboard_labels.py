"""Row labels of a leaderboard table: variants of one method are told apart by what they set."""

from __future__ import annotations

from clbench.leaderboard.labels import disambiguate


def strategy(args: dict | None) -> dict:
    return {"strategy": {"class_path": "ewc", **({"init_args": args} if args else {})},
            "model": {"class_path": "mlp", "init_args": {"hidden": 400}}}


def test_a_variant_is_named_by_the_fields_it_sets_and_the_default_by_the_method_alone():
    configs = [strategy({"ewc_lambda": 100.0}), strategy({"ewc_lambda": 100.0, "mode": "online", "gamma": 1.0})]
    assert disambiguate(["ewc", "ewc"], configs, "strategy") == ["ewc", "ewc (gamma=1.0, mode=online)"]


def test_labels_stay_distinct_and_other_components_keep_their_name():
    configs = [strategy(None), strategy({"mode": "online"}), strategy({"gamma": 0.5}),
               {**strategy(None), "model": {"class_path": "mlp", "init_args": {"hidden": 100}}}]
    labels = disambiguate(["ewc"] * 4, configs, "strategy")
    assert labels == ["ewc (model.hidden=400)", "ewc (mode=online, model.hidden=400)",
                      "ewc (gamma=0.5, model.hidden=400)", "ewc (model.hidden=100)"]
    assert len(set(labels)) == len(labels)


def test_a_label_shared_by_one_item_is_left_alone():
    assert disambiguate(["ewc", "lwf"], [strategy(None), strategy({"mode": "online"})], "strategy") == ["ewc", "lwf"]
