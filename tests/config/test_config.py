import pytest

from clbench.config.load import apply_overrides, config_hash, load_config, resolve_config
from clbench.errors import UserError


def test_defaults_fill_and_shorthand():
    cfg = resolve_config({"strategy": "replay", "train": {"epochs": 2}})
    assert cfg["strategy"] == {"class_path": "replay", "init_args": {}}
    assert cfg["train"]["epochs"] == 2 and cfg["train"]["batch_size"] == 64  # default kept
    assert cfg["model"]["class_path"] == "mlp"


def test_new_class_path_drops_default_init_args():
    cfg = resolve_config({"train": {"optimizer": {"class_path": "sgd", "init_args": {"lr": 0.1}}}})
    assert cfg["train"]["optimizer"]["init_args"] == {"lr": 0.1}


def test_overrides_parse_yaml_values():
    cfg = resolve_config({}, overrides=["train.epochs=5", "strategy.init_args.mem_size=100",
                                        "order=[rot90, rot0]", "strategy=ewc"])
    assert cfg["train"]["epochs"] == 5
    assert cfg["order"] == ["rot90", "rot0"]
    assert cfg["strategy"]["class_path"] == "ewc"


def test_hash_ignores_logging_only():
    a = resolve_config({})
    b = resolve_config({"logging": {"progress": False}})
    c = resolve_config({"seed": 1})
    assert config_hash(a) == config_hash(b)
    assert config_hash(a) != config_hash(c)


@pytest.mark.parametrize("raw, field", [
    ({"trian": {}}, "trian"),
    ({"train": {"epoch": 3}}, "train.epoch"),
    ({"train": {"epochs": "three"}}, "train.epochs"),
    ({"train": {"epochs": True}}, "train.epochs"),
    ({"train": {"epochs": 0}}, "train.epochs"),
    ({"seed": 1.5}, "seed"),
    ({"order": ["a", "a"]}, "order"),
    ({"order": {"permutation": "x"}}, "order"),
])
def test_bad_values_name_the_field(raw, field):
    with pytest.raises(UserError) as info:
        resolve_config(raw, source="cfg.yaml")
    message = info.value.one_line()
    assert f"cfg.yaml: {field}" in message and "\n" not in message


def test_unknown_key_suggests_the_close_one():
    with pytest.raises(UserError, match="did you mean 'epochs'"):
        resolve_config({"train": {"epoch": 3}})


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  epochs: [1, 2\n")
    with pytest.raises(UserError) as info:
        load_config(path)
    assert str(path) in info.value.one_line() and "line" in info.value.one_line()


def test_override_without_equals():
    with pytest.raises(UserError, match="has no '='"):
        apply_overrides({}, ["train.epochs"])
