"""What a received config may name (:func:`clbench.leaderboard.trust.check_components`, shared by
``leaderboard verify`` and ``clbench.load_model``): every component at any depth, and one named
by a bare string, is installed code or refused before anything is imported."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from clbench.cli.main import main
from clbench.errors import UserError
from clbench.leaderboard import entries as E
from clbench.leaderboard.trust import check_components


@pytest.fixture
def evil(tmp_path, monkeypatch):
    """A module in the working directory (on sys.path, as in a script or a notebook) that leaves a
    marker when imported: (its module name, its file, the marker)."""
    name = f"evil_{abs(hash(str(tmp_path))):x}"
    marker = tmp_path / "imported"
    file = tmp_path / f"{name}.py"
    file.write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('x')\n"
                    "from clbench.strategies.naive import Naive\n\nclass Evil(Naive):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, file, marker
    sys.modules.pop(name, None)


@pytest.mark.parametrize("config, field", [
    ({"strategy": {"class_path": "naive", "init_args": {"a": {"b": [[{"class_path": "{mod}:Evil"}]]}}}},
     "strategy.init_args.a.b[0][0].class_path"),
    ({"benchmark": {"class_path": "dirichlet", "init_args": {"source": {"class_path": "{file}:Evil"}}}},
     "benchmark.init_args.source.class_path"),
    ({"strategy": "{mod}:Evil"}, "strategy"),
    ({"model": "{mod}.Evil"}, "model"),
    ({"train": {"optimizer": "{mod}:Evil"}}, "train.optimizer"),
    ({"train": {"scheduler": {"class_path": "cosine", "init_args": {"x": {"class_path": "{file}:Evil"}}}}},
     "train.scheduler.init_args.x.class_path"),
])
def test_a_component_at_any_depth_or_named_by_a_bare_string_is_refused_unimported(evil, config, field):
    mod, file, marker = evil
    config = json.loads(json.dumps(config).replace("{mod}", mod).replace("{file}", str(file)))
    with pytest.raises(UserError, match="not a registered component of an installed package") as err:
        check_components(config, "sent.json")
    assert str(err.value).startswith(f"sent.json: {field} is '")
    assert f"would import and run {file}" in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists() and mod not in sys.modules


@pytest.mark.parametrize("config", [
    {"benchmark": {"class_path": "dirichlet", "init_args": {"source": {"class_path": "digits-domains"}}}},
    {"strategy": "ewc", "model": "mlp", "train": {"optimizer": "adam", "scheduler": "cosine"}},
    {"train": {"optimizer": {"class_path": "torch.optim:SGD"}}},
    {"model": {"class_path": "clbench.strategies.moe_theory:moe_theory_model"}},
    {"logging": {"loggers": ["csv", {"class_path": "tensorboard"}]}},
])
def test_installed_components_pass_at_any_depth(config):
    check_components(config, "sent.json")


def test_verify_refuses_an_entry_naming_a_module_at_depth_or_by_a_bare_string(clean_smoke_board, tmp_path,
                                                                               evil, capsys):
    from clbench.config.load import config_hash

    mod, file, marker = evil
    out = tmp_path / "lb"
    shutil.copytree(clean_smoke_board, out)
    honest = next(p for p in sorted((out / "entries").glob("*.json"))
                  if json.loads(p.read_text())["strategy"]["name"] == "naive")
    original = json.loads(honest.read_text())
    honest.unlink()
    for change, field in ((lambda c: c.update(strategy=f"{mod}:Evil"), "strategy"),
                          (lambda c: c["model"]["init_args"].update(x={"class_path": f"{file}:Evil"}),
                           "model.init_args.x.class_path")):
        entry = json.loads(json.dumps(original))  # a forger's edit, every hash recomputed
        change(entry["config"])
        entry["config_hash"] = config_hash(entry["config"])
        entry["content_hash"] = E.content_hash(entry)
        path = out / "entries" / f"{entry['config_hash']}.json"
        path.write_text(json.dumps(entry, indent=2))
        assert main(["leaderboard", "verify", str(out), path.stem]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"clbench: error: {path}: {field} is ") and "\n" not in err, err
        assert f"would import and run {file}" in err and "--trust-code" in err
        assert not marker.exists()


# -- the harness's own code: only its components ----------------------------------------------------
def _harness_file(module: str) -> str:
    import importlib.util

    return importlib.util.find_spec(module).origin


@pytest.mark.parametrize("config, field, target", [
    ({"model": {"class_path": "clbench.io:write_json", "init_args": {"path": "x", "obj": {}}}},
     "model.class_path", "clbench.io:write_json"),
    ({"strategy": "clbench.engine.runner:run"}, "strategy", "clbench.engine.runner:run"),
    ({"strategy": {"class_path": "clbench.models.factories:mlp"}}, "strategy.class_path",
     "clbench.models.factories:mlp"),  # a model factory is no strategy
    ({"benchmark": {"class_path": "dirichlet", "init_args": {"source": {
        "class_path": "clbench.benchmarks.fashion_mnist.read_file"}}}},
     "benchmark.init_args.source.class_path", "clbench.benchmarks.fashion_mnist.read_file"),
    ({"train": {"optimizer": {"class_path": "clbench.io:write_text"}}}, "train.optimizer.class_path",
     "clbench.io:write_text"),
    ({"logging": {"loggers": [{"class_path": "clbench.engine.loggers:RunLogger"}]}},
     "logging.loggers[0].class_path", "clbench.engine.loggers:RunLogger"),
])
def test_a_harness_function_that_is_no_component_of_its_place_is_refused(config, field, target):
    module, attr = target.rsplit(":", 1) if ":" in target else target.rsplit(".", 1)
    with pytest.raises(UserError) as err:
        check_components(config, "sent.json")
    assert str(err.value).startswith(
        f"sent.json: {field} is '{target}', which is not a registered component of an installed package: "
        f"rerunning it would call {attr} in {_harness_file(module)} with the config's arguments"), str(err.value)
    assert "--trust-code" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("config", [
    {"strategy": {"class_path": "clbench.strategies.naive:Naive"}},
    {"strategy": "clbench.strategies.ewc.EWC", "objective": "clbench.objectives.regression:Regression"},
    {"benchmark": {"class_path": "clbench.benchmarks.digits:digits_domains"},
     "model": {"class_path": "clbench.models.factories:mlp"}},
    {"benchmark": {"class_path": "dirichlet", "init_args": {"source": {
        "class_path": "clbench.benchmarks.core50:core50"}}}},
])
def test_an_import_path_to_a_registered_component_of_its_place_passes(config):
    check_components(config, "sent.json")


def test_each_component_named_by_import_path_only_is_the_harness_own_code():
    import inspect

    from clbench.plugins.trusted import HARNESS_PATHS
    from clbench.registry import KINDS, is_harness_file, load_import_path

    for kind, paths in HARNESS_PATHS.items():
        assert kind in KINDS
        for path in paths:
            target = load_import_path(path, path)
            assert callable(target) and is_harness_file(inspect.getsourcefile(target)), path


def _sent_run(folder, config: dict):
    """A run folder as someone may send it: only its saved model's ``model.json`` (the check comes
    before anything else of the folder is read)."""
    final = folder / "model" / "final"
    final.mkdir(parents=True)
    (final / "model.json").write_text(json.dumps({
        "format": 1, "experiences_trained": 0, "config": config, "config_hash": "0" * 64, "strategy": {},
        "frozen_base": {"names": [], "digest": None}, "tied": {}}))
    return folder, final / "model.json"


def test_load_model_refuses_a_harness_function_as_the_model_and_writes_nothing(tmp_path):
    import clbench
    from helpers import tiny_config

    marker = tmp_path / "written"
    run, manifest = _sent_run(tmp_path / "run", tiny_config(model={
        "class_path": "clbench.io:write_json", "init_args": {"path": str(marker), "obj": {"x": 1}}}))
    with pytest.raises(UserError) as err:
        clbench.load_model(run)
    assert str(err.value).startswith(
        f"{manifest}: config.model.class_path is 'clbench.io:write_json', which is not a registered component of "
        f"an installed package: loading it would call write_json in {_harness_file('clbench.io')}"), str(err.value)
    assert "trust_code=True" in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists()


def test_load_model_takes_an_import_path_to_a_registered_strategy(tmp_path):
    import clbench
    from helpers import tiny_config

    run, manifest = _sent_run(tmp_path / "run", tiny_config(strategy={"class_path": "clbench.strategies.naive:Naive"}))
    with pytest.raises(UserError, match="does not match the saved config") as err:  # past the check, to the hash
        clbench.load_model(run)
    assert str(err.value).startswith(f"{manifest}: config_hash")


def test_verify_refuses_an_entry_naming_a_harness_function_as_the_model(clean_smoke_board, tmp_path, capsys):
    from clbench.config.load import config_hash

    out = tmp_path / "lb"
    shutil.copytree(clean_smoke_board, out)
    marker = tmp_path / "written"
    honest = sorted((out / "entries").glob("*.json"))[0]
    entry = json.loads(honest.read_text())
    honest.unlink()
    entry["config"]["model"] = {"class_path": "clbench.io:write_json",
                                "init_args": {"path": str(marker), "obj": {"x": 1}}}
    entry["config_hash"] = config_hash(entry["config"])  # a forger's edit, every hash recomputed
    entry["content_hash"] = E.content_hash(entry)
    path = out / "entries" / f"{entry['config_hash']}.json"
    path.write_text(json.dumps(entry, indent=2))
    assert main(["leaderboard", "verify", str(out), path.stem]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"clbench: error: {path}: model.class_path is 'clbench.io:write_json', which is not a "
                          "registered component of an installed package: rerunning it would call write_json in "
                          f"{_harness_file('clbench.io')}") and "\n" not in err, err
    assert "--trust-code" in err and not marker.exists()


def test_every_committed_entry_and_shipped_config_names_only_registered_components():
    """What the repository ships passes the check (no rerun: the check alone, cheap)."""
    import yaml
    from helpers import REPO

    from clbench.leaderboard.suite import load_suite

    entries = sorted([*REPO.glob("leaderboard/entries/*.json"), *REPO.glob("leaderboards/*/entries/*.json")])
    configs = sorted([*REPO.glob("configs/examples/*.yaml"), *REPO.glob("configs/experiments/*.yaml")])
    suites = sorted(REPO.glob("configs/suites/*.yaml"))
    assert len(entries) > 100 and configs and suites
    for path in entries:
        check_components(json.loads(path.read_text())["config"], str(path))
    for path in configs:
        check_components(yaml.safe_load(path.read_text()), str(path))
    for path in suites:
        for run in load_suite(path).runs:
            check_components(run.config, str(path))
