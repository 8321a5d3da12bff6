"""A finished run keeps its weights (safetensors + JSON) and clbench.load_model rebuilds the model:
adapters, MoE layers and grown MLPs come back with their shapes and reproduce R's last row."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import tiny_config
from lm_helpers import TINY

import clbench
from clbench.config.load import resolve_config
from clbench.errors import UserError


def _lm(strategy: dict) -> dict:
    raw = tiny_config(benchmark={"class_path": "trace-mini",
                                 "init_args": {"tasks": ["FOMC", "NumGLUE-cm"], "n_train": 8, "n_test": 2}},
                      model={"class_path": "hf_causal_lm",
                             "init_args": {"architecture": "qwen3", "tokenizer": "trace-mini", "config": TINY}},
                      objective={"class_path": "causal_lm", "init_args": {"max_length": 64, "max_new_tokens": 2}},
                      strategy=strategy, train={"epochs": 1, "batch_size": 8,
                                                "optimizer": {"class_path": "adamw", "init_args": {"lr": 0.01}}})
    raw["model"]["init_args"].pop("hidden", None)
    return raw


VIT = {"class_path": "vit_moe", "init_args": {"label": "MoE", "patch_size": 4, "embed_dim": 16, "depth": 2,
                                              "num_heads": 2, "mlp_ratio": 2.0, "moe_blocks": [0, 1]}}
CASES = {
    "seq_lora": lambda: _lm({"class_path": "seq_lora", "init_args": {"r": 4}}),
    "mh_moe": lambda: _lm({"class_path": "mh_moe", "init_args": {"heads": 2, "r": 2}}),
    "grow": lambda: tiny_config(strategy={"class_path": "grow", "init_args": {}}),
    "vit_moe": lambda: tiny_config(model=VIT),
}


def _finished(tmp_path, raw, **kw):
    from clbench.engine.runner import ContinualRun

    run = ContinualRun(resolve_config(raw), tmp_path / "run", **kw)
    return run, run.execute()


@pytest.mark.parametrize("name", list(CASES))
def test_load_model_rebuilds_the_trained_model(tmp_path, name):
    from clbench.engine import restore, saved

    run, result = _finished(tmp_path, CASES[name]())
    trained = {k: v.detach().clone() for k, v in run.parts.model.state_dict().items()}
    model = clbench.load_model(tmp_path / "run")
    loaded = model.state_dict()
    assert loaded.keys() == trained.keys()  # the structure: adapters, experts, grown layers
    for key, value in trained.items():
        assert torch.equal(loaded[key], value), key
    assert not (tmp_path / "run" / "checkpoint.pt").exists()  # the resume checkpoint stays separate
    restored = restore.restore(tmp_path / "run", data=True)
    assert restore.evaluate(restored) == result["r_matrix"][-1]
    manifest = json.loads((tmp_path / "run" / "model" / "final" / "model.json").read_text())
    if name in ("seq_lora", "mh_moe"):  # only what was trained: the frozen base is rebuilt from the config
        stored = set(saved.load_file_keys(tmp_path / "run" / "model" / "final" / "model.safetensors"))
        assert manifest["frozen_base"]["names"] and stored and not stored & set(manifest["frozen_base"]["names"])
        assert all("lora" in key or "expert" in key or "router" in key or "gate" in key for key in stored), stored
    if name == "grow":
        assert manifest["strategy"]["growths"]  # the growth replayed on load is recorded in JSON
        assert any(v.shape != run_v.shape for v, run_v in zip(loaded.values(), _initial(run).values())
                   if v.dim() == run_v.dim())


def _initial(run):
    from clbench.plugins import build

    parts = run.parts
    return build.build_model(parts.cfg, parts.spec, parts.source, parts.objective).state_dict()


def test_every_experience_keeps_each_rows_model(tmp_path):
    from clbench.engine import restore

    _, result = _finished(tmp_path, tiny_config(save={"every_experience": True, "final": False}))
    assert sorted(p.name for p in (tmp_path / "run" / "model").iterdir()) == \
        ["experience-0", "experience-1", "experience-2"]
    for i, row in enumerate(result["r_matrix"]):
        assert restore.evaluate(restore.restore(tmp_path / "run", i, data=True)) == row
    with pytest.raises(UserError, match="holds no saved model.*experience-0"):
        clbench.load_model(tmp_path / "run")


def test_save_false_keeps_nothing_and_a_bad_value_is_one_line(tmp_path):
    _finished(tmp_path, tiny_config(save={"final": False}))
    assert not (tmp_path / "run" / "model").exists()
    with pytest.raises(UserError, match=r"save.final") as err:
        resolve_config(tiny_config(save={"final": "yes"}))
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="unknown key 'every_epoch'"):
        resolve_config(tiny_config(save={"every_epoch": True}))


def test_the_save_section_does_not_change_the_config_hash():
    from clbench.config.load import config_hash

    assert config_hash(resolve_config(tiny_config())) == config_hash(resolve_config(tiny_config(save={"final": False})))


def test_a_received_run_naming_a_python_file_is_refused(tmp_path):
    _finished(tmp_path, tiny_config())
    path = tmp_path / "run" / "model" / "final" / "model.json"
    manifest = json.loads(path.read_text())
    manifest["config"]["strategy"]["class_path"] = str(tmp_path / "evil.py") + ":Evil"
    path.write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="config.strategy.class_path is .*not a registered component"):
        clbench.load_model(tmp_path / "run")


def test_strategy_state_round_trips_through_json_and_safetensors():
    from clbench.engine.saved import decode, encode

    state = {"buffer": torch.arange(6).view(2, 3), "class_seen": {3: 4}, "pair": (1, "a"), "none": None,
             "nested": [{"t": torch.ones(2)}], "x": 0.5}
    tensors: dict = {}
    text = json.dumps(encode(state, tensors))
    back = decode(json.loads(text), tensors)
    assert torch.equal(back["buffer"], state["buffer"]) and back["class_seen"] == {3: 4}
    assert back["pair"] == (1, "a") and back["none"] is None and torch.equal(back["nested"][0]["t"], torch.ones(2))


def test_load_model_opens_no_dataset_and_refuses_a_tampered_stream(tmp_path):
    """The stream's description in model.json is what the model is rebuilt from: a Fashion-MNIST
    run's model loads with the dataset's files gone (a task-IL run: the description's classes
    decide the heads' masks, grow adds layers by experience). Without the description (a folder
    saved by an older clbench) the data is read, so the same load then fails on the missing
    files; a description someone altered is one line naming the field."""
    import shutil

    from dataset_layouts import write_fashion_mnist

    root = write_fashion_mnist(tmp_path / "fm", train_per_class=20, test_per_class=5)
    raw = tiny_config(benchmark={"class_path": "fashion-mnist-split",
                                 "init_args": {"root": str(root), "verify": "header", "scenario": "task-il",
                                               "tasks": [[0, 1], [2, 3], [4, 5]]}},
                      model={"class_path": "mlp", "init_args": {"hidden": 16}},
                      strategy={"class_path": "grow", "init_args": {}}, train={"epochs": 1, "batch_size": 32})
    run, _ = _finished(tmp_path, raw)
    trained = {k: v.detach().clone() for k, v in run.parts.model.state_dict().items()}
    shutil.rmtree(root)
    loaded = clbench.load_model(tmp_path / "run").state_dict()
    assert loaded.keys() == trained.keys() and all(torch.equal(loaded[k], v) for k, v in trained.items())

    path = tmp_path / "run" / "model" / "final" / "model.json"
    manifest = json.loads(path.read_text())
    assert [e["classes"] for e in manifest["stream"]["experiences"]] == [[0, 1], [2, 3], [4, 5]]
    tampered = json.loads(path.read_text())
    tampered["stream"]["experiences"][1]["domain_id"] = "one"
    path.write_text(json.dumps(tampered))
    with pytest.raises(UserError, match=r"stream\.experiences\.1\.domain_id") as err:
        clbench.load_model(tmp_path / "run")
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    del manifest["stream"]
    path.write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="fm"):
        clbench.load_model(tmp_path / "run")
