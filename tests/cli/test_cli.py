"""The command line: fast commands stay fast, runs write results, bad names list the valid ones."""

import json
import subprocess
import sys

from helpers import REPO, run_cli, tiny_config


def _heavy_modules_after(code: str) -> list[str]:
    probe = (f"import sys\n{code}\n"
             "print('HEAVY=' + ','.join(m for m in ('torch', 'lightning', 'torchmetrics', 'avalanche') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    marker = [line for line in out.stdout.splitlines() if line.startswith("HEAVY=")][-1]
    return [m for m in marker[len("HEAVY="):].split(",") if m]


def test_help_and_list_do_not_import_heavy_libraries():
    assert _heavy_modules_after("from clbench.cli.main import build_parser; build_parser()") == []
    assert _heavy_modules_after("from clbench.cli.main import main; main(['list'])") == []
    assert _heavy_modules_after("from clbench.cli.main import main; main(['list', '-v'])") == []
    assert _heavy_modules_after("from clbench.cli.main import main; main(['show', 'ewc'])") == []


def test_an_unknown_name_is_refused_before_the_libraries_load(tmp_path, write_yaml, capsys):
    from clbench.cli.main import main

    config = write_yaml(tiny_config())
    code = (f"from clbench.cli.main import main\nassert main(['run', '--config', {str(config)!r}, '--output', "
            f"{str(tmp_path / 'out')!r}, 'strategy.class_path=nosuch']) == 2")
    assert _heavy_modules_after(code) == []
    assert main(["run", "--config", str(config), "--output", str(tmp_path / "out"), "strategy.class_path=replai"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clbench: error: command line: strategy.class_path: unknown strategy 'replai'")
    assert "did you mean 'replay'" in err and not (tmp_path / "out").exists()


def test_list_shows_the_builtins():
    proc = run_cli("list")
    assert proc.returncode == 0
    for name in ("naive", "joint", "replay", "ewc", "lwf", "agem", "digits-domains", "digits-dirichlet", "cnn"):
        assert name in proc.stdout


def test_list_at_80_columns_breaks_words_only_at_spaces_and_import_paths_after_a_dot():
    """Rich folds a word anywhere once it is wider than its column; at 80 columns no description
    word and no import path is cut in the middle (a path breaks after a "." or ":")."""
    from clbench.plugins.describe import describe
    from clbench.registry import KINDS, available

    proc = run_cli("list", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    rows: list[list[list[str]]] = []
    for line in lines:
        cells = [c.strip() for c in line.split("│")]
        if len(cells) != 3:
            continue  # a title or header
        if cells[0]:
            rows.append([[c] for c in cells])
        else:
            for kept, cell in zip(rows[-1], cells):
                kept.append(cell)
    expected = {name: (describe(kind, name, target).summary, target)
                for kind in KINDS for name, target in available(kind).items()}
    assert sorted(r[0][0] for r in rows) == sorted(expected)
    for (name, *_), description, target in rows:
        summary, path = expected[name]
        assert " ".join(description).split() == summary.split()
        pieces = [p for p in target if p]
        assert "".join(pieces) == path and all(p[-1] in ".:" for p in pieces[:-1]), (name, pieces)


def test_run_writes_result_and_tensorboard(tmp_path, write_yaml):
    cfg = tiny_config(logging={"progress": False, "tensorboard": True})
    # overrides anywhere among the options, not only after them
    proc = run_cli("run", "--config", str(write_yaml(cfg)), "train.epochs=1", "--output", str(tmp_path / "out"),
                   "seed=3")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert len(result["r_matrix"]) == 3 and result["seed"] == 3
    events = list((tmp_path / "out" / "tensorboard").glob("events.out.tfevents.*"))
    assert events, "TensorBoard event file missing"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    images, scalars = set(), set()
    for event_file in events:  # one file per fit; TensorBoard merges a directory's files
        acc = EventAccumulator(str(event_file), size_guidance={"images": 0})
        acc.Reload()
        images |= set(acc.Tags()["images"])
        scalars |= set(acc.Tags()["scalars"])
    assert "r_matrix" in images
    assert {"eval/acc/rot0", "train/loss", "scores/bwt"} <= scalars


def test_run_overrides_may_sit_before_between_and_after_the_options():
    from clbench.cli.main import build_parser

    parser = build_parser()
    for argv in (["train.epochs=1", "--config", "c.yaml", "seed=3", "-o", "out", "--resume"],
                 ["--config", "c.yaml", "train.epochs=1", "--output", "out", "seed=3", "--resume"],
                 ["-c", "c.yaml", "-o", "out", "--resume", "train.epochs=1", "seed=3"]):
        args = parser.parse_args(["run", *argv])
        assert (args.config, args.output, args.resume, args.overrides) == \
            ("c.yaml", "out", True, ["train.epochs=1", "seed=3"]), argv


def test_unknown_names_list_the_valid_ones(tmp_path, write_yaml):
    for key, bad, valid in (("strategy", "replai", "replay"), ("benchmark", "digitz-domains", "digits-domains"),
                            ("model", "resnet9000", "mlp")):
        proc = run_cli("run", "--config", str(write_yaml(tiny_config(**{key: {"class_path": bad}}))),
                       "--output", str(tmp_path / key))
        assert proc.returncode == 2
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr
        assert f"unknown {key} '{bad}'" in lines[0] and valid in lines[0] and f"{key}.class_path" in lines[0]


def test_missing_and_malformed_config(tmp_path):
    proc = run_cli("run", "--config", str(tmp_path / "nope.yaml"), "--output", str(tmp_path / "o"))
    assert proc.returncode == 2 and "nope.yaml" in proc.stderr and "Traceback" not in proc.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {epochs: 1\n")
    proc = run_cli("run", "--config", str(bad), "--output", str(tmp_path / "o"))
    assert proc.returncode == 2 and "bad.yaml" in proc.stderr and "line" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
