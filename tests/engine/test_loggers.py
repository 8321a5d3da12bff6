"""Lightning loggers by name or class path, several at once: what they hold equals result.json."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

from clbench.cli.main import main
from helpers import tiny_config

# find_spec, not importorskip: importing mlflow takes seconds, and collecting the suite need not
pytestmark = pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow is not installed")


def _csv_rows(out: Path) -> list[dict]:
    with open(out / "csv" / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _mlflow_metric(store: Path, key: str) -> list[tuple[int, float]]:
    """(step, value) pairs of a metric in MLflow's file store (lines 'timestamp value step')."""
    (path,) = store.glob(f"*/*/metrics/{key}")
    rows = [line.split() for line in path.read_text().splitlines()]
    return [(int(step), float(value)) for _, value, step in rows]


def test_csv_and_mlflow_hold_the_run(tmp_path, write_yaml):
    out = tmp_path / "out"
    store = tmp_path / "mlflow-store"
    cfg = tiny_config(logging={"progress": False, "loggers": [
        {"class_path": "csv"}, {"class_path": "mlflow", "init_args": {"tracking_uri": f"file:{store}"}}]})
    assert main(["run", "--config", str(write_yaml(cfg)), "--output", str(out)]) == 0
    result = json.loads((out / "result.json").read_text())
    assert not (out / "tensorboard").exists()  # loggers replace the default
    assert not (out / "logs").exists()  # each logger's folder at the run folder's top level

    rows = _csv_rows(out)
    steps = [int(r["step"]) for r in rows if r.get("train/loss_step")]
    assert steps == list(range(len(steps))) and len(steps) > len(result["experiences"])  # every step
    assert [r for r in rows if r.get("lr-Adam")][0]["lr-Adam"] == "0.01"
    for i, row in enumerate(result["r_matrix"]):
        logged = next(r for r in rows if r.get(f"eval/acc/{result['experiences'][0]}") and int(r["step"]) == i)
        for name, value in zip(result["experiences"], row):
            assert float(logged[f"eval/acc/{name}"]) == pytest.approx(value)
    untrained = next(r for r in rows if r.get(f"eval_untrained/acc/{result['experiences'][0]}"))
    assert int(untrained["step"]) == 0
    for name, value in zip(result["experiences"], result["r_init"]):
        assert float(untrained[f"eval_untrained/acc/{name}"]) == pytest.approx(value)
    final = next(r for r in rows if r.get("scores/acc"))
    for key in ("acc", "bwt", "forgetting"):
        assert float(final[f"scores/{key}"]) == pytest.approx(result["scores"][key])

    assert len(_mlflow_metric(store, "train/loss_step")) == len(steps)
    assert _mlflow_metric(store, "scores/acc") == [(0, pytest.approx(result["scores"]["acc"]))]
    last = result["experiences"][-1]
    assert _mlflow_metric(store, f"eval/acc/{last}") == [(i, pytest.approx(row[-1]))
                                                          for i, row in enumerate(result["r_matrix"])]


def _leaves(value, prefix=""):
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _leaves(item, f"{prefix}.{key}" if prefix else key)
    else:
        yield prefix, value


def test_every_leaf_of_the_resolved_config_is_logged_with_its_type_and_mlflow_gets_artifacts(tmp_path, write_yaml):
    import yaml

    out = tmp_path / "out"
    cfg = tiny_config(model={"class_path": "cnn", "init_args": {"channels": 4, "hidden": 16}},
                      trainer={"accelerator": "cpu", "devices": 1, "gradient_clip_val": None},
                      logging={"progress": False, "loggers": ["csv", "mlflow"]})
    assert main(["run", "--config", str(write_yaml(cfg)), "--output", str(out)]) == 0
    result = json.loads((out / "result.json").read_text())
    leaves = dict(_leaves(result["config"]))
    assert leaves["model.init_args.channels"] == 4 and leaves["trainer.gradient_clip_val"] is None
    assert "benchmark.init_args.domains" in leaves

    logged = yaml.safe_load((out / "csv" / "hparams.yaml").read_text())
    for key, value in leaves.items():
        assert key in logged and logged[key] == value and type(logged[key]) is type(value), key

    (run,) = [p for p in (out / "mlruns").glob("*/*") if (p / "params").is_dir()]
    params = {p.name: p.read_text() for p in (run / "params").iterdir()}
    for key, value in leaves.items():
        if value != {}:  # Lightning flattens a mapping into its leaves for MLflow: an empty one has none
            assert params[key] == str(value), key  # MLflow's parameters are text: None is 'None', never 'null'
    artifacts = run / "artifacts"
    assert json.loads((artifacts / "result.json").read_text()) == result
    assert yaml.safe_load((artifacts / "config.yaml").read_text()) == result["config"]
    assert (artifacts / "r_matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("loggers, message", [
    ("csv", "logging.loggers: expected list"),
    (["tensorbord"], "unknown logger 'tensorbord' (did you mean 'tensorboard'"),
    (["csv", "csv"], "logger 'csv' is named twice"),
    ([{"class_path": "csv", "init_args": {"nosuch": 1}}], "logging.loggers[0].init_args"),
    ([{"class_path": "collections:OrderedDict"}], "is not a Lightning Logger"),
])
def test_bad_loggers_are_one_line(tmp_path, write_yaml, capsys, loggers, message):
    cfg = tiny_config(logging={"progress": False, "loggers": loggers})
    assert main(["run", "--config", str(write_yaml(cfg)), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
