"""The config file's and the suite file's fields are pydantic models (``clbench.config.schema``,
``clbench.leaderboard.suite_file.SuiteFile``), checked and worded by the mechanism that checks every
component's ``init_args`` (``clbench.config.validation``): one line naming the file, the field and the
fix, exit 2. YAML booleans are YAML 1.2's: ``yes``/``no``/``on``/``off`` are text, which a bool
field refuses."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from clbench.cli.main import main
from clbench.config.load import resolve_config
from clbench.config.yaml_files import load_yaml_text
from clbench.errors import UserError
from helpers import REPO, smoke, tiny_config, write_suite


def _refused(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clbench: error: ") and "Traceback" not in err, err
    return lines[0].removeprefix("clbench: error: ")


def _run(capsys, tmp_path, text: str, *overrides: str) -> str:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    line = _refused(capsys, "run", "--config", str(path), "--output", str(tmp_path / "out"), *overrides)
    assert not (tmp_path / "out").exists()
    return line.replace(str(path), "cfg.yaml")


# a small valid config with no train: or metrics: section, so that a case can add its own
TINY = yaml.safe_dump({k: v for k, v in tiny_config().items() if k != "train"}, sort_keys=False)


@pytest.mark.parametrize("text, message", [
    ("train:\n  batch_size: '64'\n",
     "cfg.yaml: train.batch_size: expected int, got str '64' (give train.batch_size a value of type int in [1, 2147483647])"),
    ("train:\n  epoch: 3\n",
     "cfg.yaml: train.epoch: unknown key 'epoch' (did you mean 'epochs'? valid: batch_size, deterministic, epochs, "
     "eval_batch_size, eval_every_epoch, group_by_length, num_workers, optimizer, scheduler)"),
    ("metrics:\n  reference_models: yes\n",
     "cfg.yaml: metrics.reference_models: expected bool, got str 'yes' "
     "(set metrics.reference_models to true or false)"),
    ("train:\n  deterministic: off\n",
     "cfg.yaml: train.deterministic: expected bool, got str 'off' (set train.deterministic to true or false)"),
    ("train:\n  num_workers: -1\n",
     "cfg.yaml: train.num_workers: must be >= 0, got -1 (give train.num_workers a value of type int >= 0)"),
    ("objective:\n  init_args: {max_length: 8}\n",
     "cfg.yaml: objective.class_path: missing 'class_path' (give objective.class_path a value of type str)"),
    ("pretrain:\n  fraction: 0.1\n  samples: 10\n  epochs: 1\n",
     "cfg.yaml: pretrain: give exactly one of fraction and samples (write e.g. pretrain: {fraction: 0.1, epochs: 7})"),
])
def test_a_bad_field_in_the_file_is_one_line_exit_2(capsys, tmp_path, text, message):
    assert _run(capsys, tmp_path, TINY + text) == message


def test_a_bad_override_names_the_command_line(capsys, tmp_path):
    assert _run(capsys, tmp_path, TINY, "metrics.reference_models=on") == (
        "command line: metrics.reference_models: expected bool, got str 'on' "
        "(set metrics.reference_models to true or false)")
    assert _run(capsys, tmp_path, TINY, "train.epochs=0") == (
        "command line: train.epochs: must be >= 1, got 0 (give train.epochs a value of type int >= 1)")


def test_yaml_reads_yes_no_on_off_as_text_and_true_false_as_booleans():
    assert load_yaml_text("a: yes\nb: No\nc: on\nd: OFF\ne: true\nf: False\ng: TRUE\n") == \
        {"a": "yes", "b": "No", "c": "on", "d": "OFF", "e": True, "f": False, "g": True}
    assert load_yaml_text("on: 1") == {"on": 1}  # a key too


def test_a_string_field_keeps_a_word_yaml_1_1_would_have_made_a_boolean():
    assert resolve_config({"order": "on"})["order"] == "on"  # the stream then says whether it has that order


def test_every_field_error_is_one_line_naming_the_field():
    for raw, where in (({"logging": {"loggers": "csv"}}, "cfg.yaml: logging.loggers: expected list"),
                       ({"trainer": [1]}, "cfg.yaml: trainer: expected mapping"),
                       ({"strategy": {"class_path": "naive", "init_args": 3}},
                        "cfg.yaml: strategy.init_args: expected mapping"),
                       ({7: 1}, "cfg.yaml: 7: unknown key '7'")):
        with pytest.raises(UserError) as info:
            resolve_config(raw, source="cfg.yaml")
        assert info.value.one_line().startswith(where) and "\n" not in info.value.one_line()


@pytest.mark.parametrize("change, message", [
    ({"seeds": [0, "1"]}, "seeds[1]: expected int, got str '1' (give seeds[1] a value of type int >= 0)"),
    ({"launcher": {"slurm": {"timeout_mins": 5}}},
     "launcher.slurm.timeout_mins: unknown key 'timeout_mins' (did you mean 'timeout_min'? valid: additional, "
     "cpus_per_task, gpus_per_node, jobs, mem_gb, partition, setup, timeout_min)"),
    ({"benchmarks": [{"class_path": "digits-domains", "orders": [["rot0", "rot0"]]}]},
     "benchmarks[0].orders[0]: experience(s) rot0 appear more than once (list each experience exactly once)"),
    ({"strategies": [{"class_path": "naive", "init_args": {}, "model_args": "x"}]},
     "strategies[0].model_args: expected mapping, got str 'x' (give strategies[0].model_args a value of type mapping)"),
    # a suite's base is a run config: the run config's own model refuses it, worded the same way
    ({"base": {"train": {"eval_every_epoch": "off"}}},
     "base: train.eval_every_epoch: expected bool, got str 'off' (set train.eval_every_epoch to true or false)"),
])
def test_a_bad_suite_field_is_one_line_exit_2(capsys, tmp_path, change, message):
    path = write_suite(tmp_path, smoke(**change))
    line = _refused(capsys, "leaderboard", "run", "--no-render", "--suite", str(path), "--output", str(tmp_path / "board"))
    assert line == f"{path}: {message}"
    assert not (tmp_path / "board").exists()


def test_checking_a_config_or_a_suite_does_not_import_torch():
    code = ("import sys\nfrom clbench.config.load import resolve_config\nfrom clbench.leaderboard.suite import load_suite\n"
            "resolve_config({'strategy': 'replay'})\nload_suite('configs/suites/smoke.yaml')\n"
            "print(sorted(m for m in ('torch', 'lightning', 'torchmetrics') if m in sys.modules), "
            "'pydantic' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[-2] == "[] True"


def test_importing_the_config_module_imports_no_pydantic():
    """Entries, tables and hashes import clbench.config.load; only checking a config needs pydantic."""
    code = "import sys, clbench.config.load, clbench.leaderboard.entries; print('pydantic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
