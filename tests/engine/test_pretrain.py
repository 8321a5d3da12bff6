"""Pretraining on a subset held out of every experience, before the stream (``pretrain:``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clbench.engine import pretrain
from clbench.config.load import resolve_config
from clbench.errors import UserError
from clbench.engine.runner import run
from clbench.data.streams import ordered_experiences
from helpers import crash_at, tiny_config

PRETRAIN = {"fraction": 0.2, "epochs": 2}


def _experiences():
    from clbench.benchmarks.digits import digits_domains

    return ordered_experiences(digits_domains(domains=["rot0", "rot90", "rot180"]), "default")


def _settings(section: dict) -> dict | None:
    return pretrain.settings({"pretrain": section}, "exp.yaml")


def test_the_held_out_samples_leave_their_experiences():
    original = _experiences()
    exps = _experiences()
    held = pretrain.carve(_settings(PRETRAIN), exps, seed=0)
    pieces = []
    for before, after, chosen in zip(original, exps, held.held_out):
        n = len(before.train)
        assert len(after.train) + len(chosen) == n
        assert len(chosen) == round(0.2 * n) and len(set(chosen.tolist())) == len(chosen)
        keep = np.setdiff1d(np.arange(n), chosen)
        assert torch.equal(after.train.x, before.train.x[keep])  # what is left is the rest, in order
        pieces.append(before.train.x[chosen])
    assert len(held.dataset) == sum(len(c) for c in held.held_out)
    assert torch.equal(held.dataset.x, torch.cat(pieces))
    # the same seed holds out the same samples, whatever the order; another seed others
    again = list(reversed(_experiences()))
    assert all(np.array_equal(a, b) for a, b in zip(reversed(pretrain.carve(_settings(PRETRAIN), again, 0).held_out),
                                                   held.held_out))
    assert not np.array_equal(pretrain.carve(_settings(PRETRAIN), _experiences(), 1).held_out[0], held.held_out[0])


def test_a_sample_count_is_shared_in_proportion_to_the_experiences():
    exps = _experiences()
    held = pretrain.carve(_settings({"samples": 100, "epochs": 1}), exps, seed=0)
    assert len(held.dataset) == 100 and [len(c) for c in held.held_out] == [34, 33, 33]


@pytest.mark.parametrize("section, field", [
    ({"fraction": 0.1, "samples": 10, "epochs": 1}, "pretrain"),
    ({"epochs": 1}, "pretrain"),
    ({"fraction": 0.1}, "pretrain.epochs"),
    ({"fraction": 1.5, "epochs": 1}, "pretrain.fraction"),
    ({"samples": 0, "epochs": 1}, "pretrain.samples"),
    ({"fraction": 0.1, "epochs": 0}, "pretrain.epochs"),
])
def test_bad_settings_are_one_line_errors(section, field):
    with pytest.raises(UserError) as err:
        _settings(section)
    assert str(err.value).startswith(f"exp.yaml: {field}:") and "\n" not in str(err.value)


def test_unknown_keys_and_oversized_subsets_are_refused():
    with pytest.raises(UserError, match="pretrain.fractoin"):
        resolve_config(tiny_config(pretrain={"fractoin": 0.1, "epochs": 1}))
    for section, field in (({"fraction": "0.1", "epochs": 1}, "fraction"), ({"fraction": 0.1, "epochs": 1.5}, "epochs")):
        with pytest.raises(UserError, match=rf"pretrain\.{field}: expected"):
            resolve_config(tiny_config(pretrain=section))
    with pytest.raises(UserError, match="leaves no training samples"):
        pretrain.carve(_settings({"fraction": 0.9999, "epochs": 1}), _experiences(), 0)
    with pytest.raises(UserError, match="cannot cover 3 experiences"):
        pretrain.carve(_settings({"samples": 2, "epochs": 1}), _experiences(), 0)


def test_pretraining_runs_before_the_first_experience_and_sets_the_starting_scores():
    plain = run(resolve_config(tiny_config()), None)
    result = run(resolve_config(tiny_config(pretrain=PRETRAIN)), None)
    record = result["pretrain"]
    assert record["r_untrained"] == plain["r_init"]  # the same initial model, scored before pretraining
    assert record["r_pretrained"] == result["r_init"] != plain["r_init"]
    assert np.mean(result["r_init"]) > np.mean(plain["r_init"]) + 0.2  # it learned something
    assert len(result["r_matrix"]) == 3 and result["experiences"] == plain["experiences"]
    assert record["samples_total"] == sum(record["samples"].values()) == 3 * round(0.2 * 1347)
    assert record["epochs"] == 2 and record["fraction"] == 0.2


def _without_times(result: dict) -> dict:
    keep = ("r_matrix", "r_init", "scores", "reference", "objective")
    return {**{k: result.get(k) for k in keep}, "pretrain": {k: v for k, v in result["pretrain"].items()
                                                              if k != "seconds"}}


def test_a_killed_run_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch):
    cfg = resolve_config(tiny_config(pretrain=PRETRAIN, metrics={"reference_models": True},
                                     objective={"class_path": "classification",
                                                "init_args": {"class_weights": {"alpha": "auto"}}}))
    whole = run(cfg, tmp_path / "whole")
    crash_at(monkeypatch, "stage:1:step:5", cfg, tmp_path / "killed")
    resumed = run(cfg, tmp_path / "killed", resume=True)
    assert resumed["compute"]["resumes"] == 1
    assert _without_times(resumed) == _without_times(whole)
    # reference models start from the pretrained weights
    plain_reference = run(resolve_config(tiny_config(metrics={"reference_models": True})), None)["reference"]
    assert whole["reference"] != plain_reference


def test_reference_models_start_from_a_plain_pretraining_whatever_the_strategy_changed():
    """seq_lora injects LoRA at setup, so its pretraining trains the adapter (the base frozen);
    a reference model is the plain model trained on one experience, and starts from the plain
    model's pretraining, the one naive's run pretrains: the references are the same under both
    strategies, and not those of a run without pretraining."""
    from lm_helpers import lm_config

    def references(strategy: dict, pretraining: dict | None) -> list[float]:
        cfg = lm_config(strategy)
        cfg["benchmark"]["init_args"]["tasks"] = ["FOMC", "Py150"]  # Py150's edit similarity is not 0
        cfg["train"].update(epochs=3, batch_size=4)
        cfg["train"]["optimizer"]["init_args"]["lr"] = 0.02
        cfg["metrics"]["reference_models"] = True
        if pretraining:
            cfg["pretrain"] = pretraining
        return run(resolve_config(cfg), None)["reference"]

    pretraining = {"fraction": 0.25, "epochs": 1}
    naive = references({"class_path": "naive"}, pretraining)
    lora = references({"class_path": "seq_lora", "init_args": {"r": 4}}, pretraining)
    assert lora == naive and any(naive)
    assert references({"class_path": "naive"}, None) != naive
