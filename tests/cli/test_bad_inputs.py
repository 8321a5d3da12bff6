"""The catalogue of bad inputs, each through the real CLI.

Every case must end with exit status 2 and exactly one line on stderr, ``clbench: error: ...``,
naming the file or field and the fix, with no traceback, and must leave the disk exactly as
it found it: by default the output folder holds a previous finished run and ``--overwrite`` is
passed, so a bad config must not destroy the run it would replace. The table is mirrored in
``docs/reliability.md``.

Each case is its own test. It calls the console script's function, ``clbench.cli.main.main``, in the
test process (:func:`helpers.cli_in_process`: the status it returns or exits with, everything
written to stdout and stderr, the warnings a new process would print). A representative few
(``process=True``: one per layer of checks) also run as a separate ``python -m clbench.cli.main``
process with its own time limit, for what only a new process shows: warnings printed while
importing, and the status the interpreter exits with.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from clbench.config.load import deep_merge
from clbench.errors import UserError
from helpers import REPO, cli_in_process, kill_env, run_cli, tiny_config

BASE = tiny_config()

NOT_A_STRATEGY = '''
class Helper:
    """Not a Strategy subclass."""
'''

CLASS_IL_ONLY = '''
from clbench.strategy import Strategy


class ClassILOnly(Strategy):
    supports = frozenset({"class-il"})
'''

# Strategy plugins whose hooks break their contract (one class per case; line numbers are asserted).
MISBEHAVING = '''import torch
from clbench import Strategy


class Arity(Strategy):
    def prepare_batch(self, batch):
        return batch


class Raises(Strategy):
    def after_experience(self, ctx, experience):
        return 1 / 0


class IntBatch(Strategy):
    def prepare_batch(self, ctx, batch):
        return 3


class NoneLoss(Strategy):
    def training_loss(self, ctx, x, y, logits, loss):
        loss * 2


class StrLoss(Strategy):
    def training_loss(self, ctx, x, y, logits, loss):
        return "loss"


class TensorDiagnostics(Strategy):
    def diagnostics(self):
        return {"stages": [{"w": torch.ones(2)}]}


class NanParams(Strategy):
    def hparams(self):
        return {"scale": float("nan")}
'''


def _misbehaving(name: str) -> dict:
    return {**BASE, "strategy": f"{{dir}}/mine.py:{name}"}


def cfg(**overrides) -> dict:
    return deep_merge(BASE, overrides)


@dataclass
class Case:
    """One bad input. ``message`` holds substrings the error line must contain; ``{cfg}``,
    ``{out}`` and ``{dir}`` stand for the config path, the output folder and the case folder."""

    id: str
    config: Any = None            # dict: written as YAML; str: written as is; bytes: raw; None: not written
    args: tuple[str, ...] = ()
    message: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()  # substrings the error line must not contain
    output: str = "previous"      # previous | empty | checkpoint | complete | none
    overwrite: bool = True        # pass --overwrite (with output "previous")
    setup: Callable[[Path], None] | None = None
    config_name: str = "config.yaml"
    skip: str | None = None
    process: bool = False         # also run as a separate process
    env: dict[str, str] | None = None  # environment variables set for the command


def _write_file(name: str, text: str) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        (d / name).write_text(textwrap.dedent(text))
    return setup


def _core50_corrupt(d: Path) -> None:
    from dataset_layouts import write_core50

    write_core50(d / "core50", sessions=[1, 2], objects=[1, 2], frames=3, size=8)
    (d / "core50" / "core50_128x128" / "s2" / "o1" / "C_02_01_001.png").write_bytes(b"not a png at all")


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` pixels and holds none (a decompression bomb's header)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


def _core50_huge(side: int) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        from dataset_layouts import write_core50

        write_core50(d / "core50", sessions=[1, 2], objects=[1, 2], frames=3, size=8)
        (d / "core50" / "core50_128x128" / "s2" / "o1" / "C_02_01_001.png").write_bytes(_png_header(side, side))
    return setup


def _output_is_file(d: Path) -> None:
    (d / "out").write_text("I am a file\n")


def _readonly_output(d: Path) -> None:
    (d / "out").mkdir()
    (d / "out").chmod(0o500)


def _readonly_cache(d: Path) -> None:
    (d / "cache").mkdir()
    (d / "cache").chmod(0o500)
    (d / "model.gguf").write_text("GGUF")  # never read: the cache is refused before the file


def _older_checkpoint(d: Path) -> None:
    import torch

    path = d / "out" / "checkpoint.pt"
    ckpt = torch.load(path, weights_only=True)
    ckpt["schema"] = 1
    torch.save(ckpt, path)


def _truncate_checkpoint(d: Path) -> None:
    path = d / "out" / "checkpoint.pt"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


GGUF_RUN = {**BASE, "benchmark": {"class_path": "trace-mini", "init_args": {"tasks": ["FOMC"], "n_train": 4, "n_test": 2}},
            "model": {"class_path": "hf_causal_lm", "init_args": {"path": "{dir}/model.gguf"}},
            "objective": {"class_path": "causal_lm", "init_args": {"max_length": 64, "max_new_tokens": 2}},
            "strategy": "seq_ft"}

PRESET_RUN = {**GGUF_RUN, "model": {"class_path": "hf_causal_lm", "init_args": {"path": "smollm2-135m-instruct"}}}
ROOT = os.geteuid() == 0

CORE50 = {"class_path": "clbench.benchmarks.core50:core50",
          "init_args": {"root": "{dir}/core50", "sessions": [1, 2], "objects": [1, 2], "image_size": 8,
                        "augment": False}}

CASES = [
    # -- the config file itself
    Case("missing config file", config=None, message=("{cfg}", "does not exist", "--config"), process=True),
    Case("config is a directory", config=None, setup=lambda d: (d / "config.yaml").mkdir(),
         message=("{cfg}", "is a directory", "give a .yaml file")),
    Case("malformed YAML", config="seed: [1, 2\ntrain: {epochs: 1}\n", message=("{cfg}", "malformed YAML", "line")),
    Case("not a text file", config=b"\xff\xfe\x00\x81binary", message=("{cfg}", "not a text file")),
    Case("top level not a mapping", config="- seed\n- 1\n", message=("{cfg}", "expected a mapping")),
    # -- keys and types
    Case("unknown top-level key", config={**BASE, "sed": 1}, message=("{cfg}: sed", "did you mean 'seed'")),
    Case("unknown nested key", config=cfg(train={"epoch": 2}), message=("{cfg}: train.epoch", "did you mean 'epochs'")),
    Case("missing required key", config={**BASE, "benchmark": {"class_path": "clbench.benchmarks.core50:core50"}},
         message=("{cfg}: benchmark.init_args", "missing required argument(s) root", "add root")),
    Case("wrong type", config=cfg(train={"epochs": "three"}), message=("{cfg}: train.epochs", "expected int", "str")),
    Case("bool where int expected", config=cfg(train={"epochs": True}), message=("{cfg}: train.epochs", "bool")),
    Case("zero epochs", config=cfg(train={"epochs": 0}), message=("{cfg}: train.epochs", "must be >= 1, got 0")),
    Case("negative batch size", config=cfg(train={"batch_size": -8}),
         message=("{cfg}: train.batch_size", "must be >= 1, got -8")),
    Case("wrong type for a flag", config=cfg(train={"eval_every_epoch": "yes"}),
         message=("{cfg}: train.eval_every_epoch", "bool")),
    Case("seed a float", config={**BASE, "seed": 1.5}, message=("{cfg}: seed", "expected int", "float")),
    Case("seed a string", config={**BASE, "seed": "a"}, message=("{cfg}: seed", "expected int", "str")),
    Case("seed negative", config={**BASE, "seed": -1}, message=("{cfg}: seed", "must be >= 0")),
    Case("init_args not a mapping", config={**BASE, "strategy": {"class_path": "naive", "init_args": [1]}},
         message=("{cfg}: strategy.init_args", "mapping")),
    Case("class_path not a string", config={**BASE, "model": {"class_path": 3}},
         message=("{cfg}: model.class_path", "expected str")),
    Case("trainer not a mapping", config={**BASE, "trainer": 5}, message=("{cfg}: trainer", "expected mapping")),
    # -- names
    Case("unknown strategy", config={**BASE, "strategy": "replai"},
         message=("{cfg}: strategy.class_path", "unknown strategy 'replai'", "did you mean 'replay'", "naive")),
    Case("unknown benchmark", config={**BASE, "benchmark": "digits-domain"},
         message=("{cfg}: benchmark.class_path", "did you mean 'digits-domains'", "digits-dirichlet")),
    Case("unknown model", config={**BASE, "model": "mlpp"},
         message=("{cfg}: model.class_path", "unknown model 'mlpp'", "did you mean 'mlp'")),
    Case("unknown optimizer", config=cfg(train={"optimizer": {"class_path": "adamx"}}),
         message=("{cfg}: train.optimizer.class_path", "did you mean 'adam'")),
    Case("import path to a missing file", config={**BASE, "strategy": "{dir}/nothere.py:Mine"},
         message=("{cfg}: strategy.class_path", "nothere.py does not exist")),
    Case("import path to a missing class", config={**BASE, "strategy": "{dir}/mine.py:Mine"},
         setup=_write_file("mine.py", NOT_A_STRATEGY), message=("{cfg}: strategy.class_path", "no attribute 'Mine'")),
    Case("import path to a non-strategy", config={**BASE, "strategy": "{dir}/mine.py:Helper"},
         setup=_write_file("mine.py", NOT_A_STRATEGY),
         message=("{cfg}: strategy.class_path", "not a clbench Strategy subclass")),
    Case("import path to a missing module", config={**BASE, "strategy": "no_such_pkg.strats:Thing"},
         message=("{cfg}: strategy.class_path", "cannot import module 'no_such_pkg.strats'")),
    Case("plugin file that exits while imported", config={**BASE, "strategy": "{dir}/mine.py:Mine"},
         setup=_write_file("mine.py", "import sys\n\nsys.exit(0)\n"),
         message=("{cfg}: strategy.class_path", "mine.py:3: SystemExit: 0", "raised while importing")),
    Case("strategy does not support the stream", config={**BASE, "strategy": "{dir}/mine.py:ClassILOnly"},
         setup=_write_file("mine.py", CLASS_IL_ONLY), message=("{cfg}: strategy", "does not support domain-il"),
         process=True),
    # -- strategy hooks that break their contract (clbench.plugins.hooks)
    Case("plugin hook of the wrong arity", config=_misbehaving("Arity"), setup=_write_file("mine.py", MISBEHAVING),
         message=("{cfg}: strategy.class_path", "{dir}/mine.py:6: Arity.prepare_batch(self, batch) cannot take",
                  "prepare_batch(ctx, batch) -> (inputs, targets)")),
    Case("plugin hook that raises", config=_misbehaving("Raises"), setup=_write_file("mine.py", MISBEHAVING),
         message=("{cfg}: strategy", "{dir}/mine.py:12: ZeroDivisionError: division by zero",
                  "Raises.after_experience(), called as after_experience(ctx, experience) -> None")),
    Case("prepare_batch returning an int", config=_misbehaving("IntBatch"), setup=_write_file("mine.py", MISBEHAVING),
         message=("{cfg}: strategy", "{dir}/mine.py:16: IntBatch.prepare_batch() returned int 3",
                  "prepare_batch(ctx, batch) -> (inputs, targets)")),
    Case("training_loss returning None", config=_misbehaving("NoneLoss"), setup=_write_file("mine.py", MISBEHAVING),
         message=("{cfg}: strategy", "{dir}/mine.py:21: NoneLoss.training_loss() returned NoneType None",
                  "training_loss(ctx, x, y, logits, loss) -> the loss as a torch.Tensor")),
    Case("training_loss returning a string", config=_misbehaving("StrLoss"), setup=_write_file("mine.py", MISBEHAVING),
         message=("{cfg}: strategy", "{dir}/mine.py:26: StrLoss.training_loss() returned str 'loss'")),
    Case("diagnostics JSON cannot write", config=_misbehaving("TensorDiagnostics"),
         setup=_write_file("mine.py", MISBEHAVING),
         message=("{cfg}: strategy", "{dir}/mine.py:31: TensorDiagnostics.diagnostics()['stages'][0]['w'] is a "
                  "torch.Tensor, which JSON cannot write", "tensor.tolist()")),
    Case("hparams JSON cannot write", config=_misbehaving("NanParams"), setup=_write_file("mine.py", MISBEHAVING),
         message=("{cfg}: strategy", "{dir}/mine.py:36: NanParams.hparams()['scale'] is nan")),
    # -- init_args
    Case("unknown strategy init_args key", config={**BASE, "strategy": {"class_path": "replay",
                                                                     "init_args": {"mem_sise": 10}}},
         message=("{cfg}: strategy.init_args.mem_sise", "did you mean 'mem_size'")),
    Case("wrong strategy init_args type", config={**BASE, "strategy": {"class_path": "replay",
                                                                    "init_args": {"mem_size": "lots"}}},
         message=("{cfg}: strategy.init_args.mem_size", "expected int")),
    Case("strategy init_args value refused", config={**BASE, "strategy": {"class_path": "replay",
                                                                       "init_args": {"mem_size": -5}}},
         message=("{cfg}: strategy.init_args.mem_size", "mem_size must be >= 0")),
    Case("unknown model init_args key", config=cfg(model={"init_args": {"hiden": 8}}),
         message=("{cfg}: model.init_args.hiden", "did you mean 'hidden'")),
    Case("unknown optimizer init_args key", config=cfg(train={"optimizer": {"init_args": {"lrr": 0.1}}}),
         message=("{cfg}: train.optimizer.init_args.lrr", "did you mean 'lr'")),
    # -- orders
    Case("order with a duplicate", config={**BASE, "order": ["rot0", "rot0", "rot90"]},
         message=("{cfg}: order", "rot0 appear more than once")),
    Case("order with an unknown experience", config={**BASE, "order": ["rot0", "rot90", "rot45"]},
         message=("{cfg}: order", "unknown experience(s) rot45", "rot180")),
    Case("order leaving one out", config={**BASE, "order": ["rot0", "rot90"]},
         message=("{cfg}: order", "leaves out rot180")),
    Case("bad permutation spec", config={**BASE, "order": {"permutation": "x"}},
         message=("{cfg}: order", "unrecognised order", "permutation")),
    Case("unknown named order", config={**BASE, "order": "backwards"},
         message=("{cfg}: order", "unknown order 'backwards'", "reverse")),
    # -- streams
    Case("unknown digits domain", config=cfg(benchmark={"init_args": {"domains": ["rot0", "rot45"]}}),
         message=("{cfg}: benchmark.init_args.domains", "rot45", "did you mean")),
    Case("empty experience after a Dirichlet split",
         config={**BASE, "benchmark": {"class_path": "digits-dirichlet",
                                       "init_args": {"num_experiences": 8, "alpha": 0.01, "min_size": 0}}},
         message=("{cfg}: benchmark.init_args.min_size", "empty", "min_size >= 1")),
    Case("min_size infeasible",
         config={**BASE, "benchmark": {"class_path": "digits-dirichlet",
                                       "init_args": {"min_size": 250, "alpha": 0.05}}},
         message=("{cfg}: benchmark.init_args.min_size", "no Dirichlet draw", "raise alpha")),
    Case("data root missing", config={**BASE, "benchmark": {**CORE50, "init_args": {"root": "{dir}/nowhere"}}},
         message=("{dir}/nowhere", "does not exist")),
    Case("malformed image", config={**BASE, "benchmark": CORE50}, setup=_core50_corrupt, output="empty",
         message=("C_02_01_001.png", "cannot decode image", "delete the corrupt file"), process=True),
    Case("image too large to decode", config={**BASE, "benchmark": CORE50}, setup=_core50_huge(20000),
         output="empty", message=("C_02_01_001.png", "image too large to decode safely",
                                  "400000000 pixels", "delete the file")),
    Case("image over the decompression-bomb warning size", config={**BASE, "benchmark": CORE50},
         setup=_core50_huge(10000), output="empty",
         message=("C_02_01_001.png", "image too large to decode safely", "10000x10000 = 100,000,000 pixels")),
    # -- trainer
    Case("reserved trainer key", config=cfg(trainer={"max_epochs": 5}),
         message=("{cfg}: trainer.max_epochs", "set by the runner", "train.epochs")),
    Case("unknown trainer argument", config=cfg(trainer={"acelerator": "cpu"}),
         message=("{cfg}: trainer.acelerator", "unknown Trainer argument", "did you mean 'accelerator'"),
         absent=("max_epochs", "callbacks"), process=True),  # reserved arguments are not suggested
    Case("trainer strategy that starts processes at every fit", config=cfg(trainer={"strategy": "ddp_spawn"}),
         message=("{cfg}: trainer.strategy", "starts new processes at every fit", "trainer.strategy: ddp")),
    # -- command line
    Case("override without '='", config=BASE, args=("train.epochs",),
         message=("override 'train.epochs' has no '='", "key.path=value")),
    Case("override to an unknown key", config=BASE, args=("train.epoch=3",),
         message=("command line: train.epoch", "did you mean 'epochs'")),
    Case("override of the wrong type", config=BASE, args=("train.epochs=abc",),
         message=("command line: train.epochs", "expected int")),
    Case("unknown command-line option", config=BASE, args=("--no-such-flag",),
         message=("unrecognized arguments: --no-such-flag", "--help"), process=True),
    # -- the output folder
    Case("output path is a file", config=BASE, output="none", setup=_output_is_file,
         message=("--output", "is a file", "directory")),
    Case("output parent is a file", config=BASE, output="none", setup=_output_is_file, args=("--output", "{out}/sub"),
         message=("--output", "cannot write", "writable")),
    Case("output not writable", config=BASE, output="none", setup=_readonly_output,
         message=("--output", "cannot write", "Permission denied"),
         skip="running as root: permissions do not stop root's writes" if os.geteuid() == 0 else None),
    Case("output in a system folder no one may write", config=BASE, output="none",
         args=("--output", "/sys/kernel"), message=("--output", "cannot write to /sys/kernel", "writable"),
         skip=None if Path("/sys/kernel").is_dir() else "no /sys/kernel on this system"),
    Case("staging folder that is a file", config=BASE, setup=_write_file("out/.staging", "not a folder\n"),
         message=("--output", "{out}/.staging is a file", "move or delete that file")),
    Case("output holds a finished run", config=BASE, overwrite=False,
         message=("--output", "already holds a finished run", "--overwrite")),
    Case("output holds an unfinished run", config=BASE, output="checkpoint", overwrite=False,
         message=("--output", "holds an unfinished run", "--resume")),
    # -- resume
    Case("resume without a checkpoint", config=BASE, output="empty", args=("--resume",),
         message=("--resume", "no checkpoint to resume", "run without --resume")),
    Case("resume a complete run", config=BASE, output="complete", args=("--resume",),
         message=("--resume", "already complete")),
    Case("resume with a differing config", config=cfg(train={"epochs": 2}), output="checkpoint", args=("--resume",),
         message=("{cfg}", "differs from the checkpoint's at train.epochs", "checkpoint 1, now 2")),
    Case("resume and overwrite together", config=BASE, output="checkpoint", args=("--resume", "--overwrite"),
         message=("--resume", "not both")),
    Case("resume from an older checkpoint format", config=BASE, output="checkpoint", args=("--resume",),
         setup=_older_checkpoint, message=("--resume", "has format 1", "with --overwrite")),
    Case("resume from a damaged checkpoint", config=BASE, output="checkpoint", args=("--resume",),
         setup=_truncate_checkpoint, message=("--resume", "cannot read checkpoint", "rerun without --resume"),
         process=True),
    Case("GGUF file missing", config=GGUF_RUN, message=("model.init_args.path", "model.gguf does not exist")),
    Case("GGUF file truncated", config=GGUF_RUN, setup=_write_file("model.gguf", "GGUF\x03\x00\x00\x00\x14"),
         message=("model.init_args.path", "model.gguf is not a complete GGUF file", "download it again")),
    # -- the cache folder ($CLBENCH_CACHE_DIR)
    Case("cache folder of an unknown user", config=PRESET_RUN, env={"CLBENCH_CACHE_DIR": "~nosuchuser/x"},
         message=("CLBENCH_CACHE_DIR: ~nosuchuser/x names the home folder of 'nosuchuser'", "a folder of yours")),
    Case("cache folder not writable", config=GGUF_RUN, env={"CLBENCH_CACHE_DIR": "{dir}/cache/sub"},
         setup=_readonly_cache, message=("CLBENCH_CACHE_DIR: cannot keep files under {dir}/cache: no write "
                                         "permission", "a folder of yours"),
         skip="running as root: permissions do not stop root's writes" if ROOT else None),
    # -- model sizes, checked against memory before the model is built
    Case("model larger than memory", config=cfg(model={"init_args": {"hidden": 1000000}}),
         message=("{cfg}: model.init_args: the model needs 8.0 TB", "of memory available",
                  "lower hidden=1000000)")),
    Case("model sizes past what torch can count", config=BASE, args=("model.init_args.hidden=1000000000000",),
         message=("{cfg}: model.init_args: the model's sizes overflow torch's 64-bit tensor sizes",
                  "lower hidden=1000000000000")),
]


def _subst(value: Any, d: Path, out: Path, config: Path) -> Any:
    if isinstance(value, str):
        return value.replace("{dir}", str(d)).replace("{out}", str(out)).replace("{cfg}", str(config))
    if isinstance(value, dict):
        return {k: _subst(v, d, out, config) for k, v in value.items()}
    if isinstance(value, list):
        return [_subst(v, d, out, config) for v in value]
    return value


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root``, with its bytes (None for folders). A killed run's stale
    folder lock (``.clbench-run.lock``) is left out: the next run may take it over and clear it."""
    from clbench.engine.outputs import RUN_LOCK

    out = {}
    for path in sorted(root.rglob("*")):
        if path.name != RUN_LOCK:
            out[str(path.relative_to(root))] = None if path.is_dir() else path.read_bytes()
    return out


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory) -> Path:
    """An output folder holding a real checkpoint (killed during the second experience)."""
    d = tmp_path_factory.mktemp("interrupted")
    config = d / "config.yaml"
    config.write_text(yaml.safe_dump(BASE))
    env = kill_env("stage:1:step:0")
    proc = subprocess.run([sys.executable, "-m", "clbench.cli.main", "run", "--config", str(config), "--output",
                           str(d / "out"), "--no-progress"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -9, proc.stderr
    assert (d / "out" / "checkpoint.pt").is_file()
    return d / "out"


def _prepare(case: Case, d: Path, interrupted: Path | None) -> tuple[list[str], Path]:
    out = d / "out"
    config = d / case.config_name
    if case.output == "previous":
        out.mkdir()
        (out / "result.json").write_text('{"status": "ok", "note": "a previous finished run"}\n')
        (out / "tensorboard").mkdir()
        (out / "tensorboard" / "events.out.tfevents.1.previous").write_bytes(b"previous events")
        (out / "notes.txt").write_text("keep me\n")
    elif case.output == "empty":
        out.mkdir()
    elif case.output == "checkpoint":
        shutil.copytree(interrupted, out)
    elif case.output == "complete":
        out.mkdir()
        (out / "result.json").write_text('{"status": "ok"}\n')
    if case.setup is not None:
        case.setup(d)
    if isinstance(case.config, (dict, list)):
        config.write_text(yaml.safe_dump(_subst(case.config, d, out, config), sort_keys=False))
    elif isinstance(case.config, str):
        config.write_text(case.config)
    elif isinstance(case.config, bytes):
        config.write_bytes(case.config)
    argv = ["run", "--config", str(config), "--output", str(out), "--no-progress"]
    if case.output == "previous" and case.overwrite:
        argv.append("--overwrite")
    argv += [_subst(a, d, out, config) for a in case.args]
    return argv, out


def test_the_catalogue_is_large_enough_and_documented():
    assert len(CASES) >= 22
    assert len({c.id for c in CASES}) == len(CASES)
    docs = (REPO / "docs" / "reliability.md").read_text()
    rows = {line.split("|")[2].strip() for line in docs.splitlines() if line.startswith("| ") and line.count("|") >= 5}
    assert {c.id for c in CASES} <= rows, sorted({c.id for c in CASES} - rows)
    flat = " ".join(docs.split())
    named = flat[flat.index("One case per layer of checks"):flat.index("also runs as a separate")]
    assert all(c.id in named for c in PROCESS_CASES), "docs/reliability.md must name the cases run as processes"


@pytest.fixture
def prepared(request, tmp_path):
    """The case's folder as the case wants it; read-only folders are made writable again after."""
    case = request.param
    if case.skip:
        pytest.skip(case.skip)
    interrupted = request.getfixturevalue("interrupted_run") if case.output == "checkpoint" else None
    argv, out = _prepare(case, tmp_path, interrupted)
    for name, value in (case.env or {}).items():
        request.getfixturevalue("monkeypatch").setenv(name, _subst(value, tmp_path, out, tmp_path / case.config_name))
    yield case, argv, out
    for path in tmp_path.rglob("*"):
        if path.is_dir():
            path.chmod(0o755)


def _check(case: Case, proc, d: Path, out: Path, before: dict) -> None:
    assert proc.returncode == 2, f"exit {proc.returncode}\nstderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{proc.stderr}"
    line = lines[0]
    assert line.startswith("clbench: error: ")
    assert "(" in line and line.endswith(")"), f"no fix given: {line}"
    for needle in case.message:
        needle = needle.replace("{cfg}", str(d / case.config_name)).replace("{out}", str(out)) \
            .replace("{dir}", str(d))
        assert needle in line, f"{needle!r} not in:\n{line}"
    for needle in case.absent:
        assert needle not in line, f"{needle!r} in:\n{line}"
    # nothing written, nothing removed, nothing changed
    assert _snapshot(d) == before


@pytest.mark.parametrize("prepared", CASES, ids=[c.id for c in CASES], indirect=True)
def test_bad_input_is_one_clean_line_and_exit_2(prepared, tmp_path, capfd):
    case, argv, out = prepared
    before = _snapshot(tmp_path)
    _check(case, cli_in_process(capfd, *argv, folders=(tmp_path,)), tmp_path, out, before)


PROCESS_CASES = [c for c in CASES if c.process]


@pytest.mark.slow
@pytest.mark.parametrize("prepared", PROCESS_CASES, ids=[c.id for c in PROCESS_CASES], indirect=True)
def test_bad_input_in_a_new_process(prepared, tmp_path):
    case, argv, out = prepared
    before = _snapshot(tmp_path)
    _check(case, run_cli(*argv, timeout=300), tmp_path, out, before)


def _misbehaving_handler(how: str):
    def handle(args) -> int:
        if how == "traceback":
            raise ValueError("a bug")
        if how == "warning":
            warnings.warn("clbench's own warning", UserWarning, stacklevel=1)
        if how == "library log":
            logging.getLogger("lightning.pytorch").error("a library's error line")
        if how == "C-level write":
            os.write(2, b"written below Python\n")
        if how == "disk":
            Path(args.output).mkdir()
        raise UserError("the bad input", where="--config", fix="fix it")
    return handle


@pytest.mark.parametrize("how", ["traceback", "warning", "library log", "C-level write", "disk"])
def test_a_command_that_misbehaves_fails_the_check(how, tmp_path, capfd, monkeypatch):
    """The in-process run sees what a user would: each misbehaviour makes a case fail."""
    from clbench.cli import run

    case = Case("missing config file", config=BASE, message=("the bad input",), output="none")
    argv, out = _prepare(case, tmp_path, None)
    before = _snapshot(tmp_path)
    monkeypatch.setattr(run, "handle", _misbehaving_handler(how))
    got = cli_in_process(capfd, *argv, folders=(tmp_path,))
    with pytest.raises(AssertionError):
        _check(case, got, tmp_path, out, before)
    monkeypatch.setattr(run, "handle", _misbehaving_handler("nothing"))
    _check(case, cli_in_process(capfd, *argv, folders=(tmp_path,)), tmp_path, out, _snapshot(tmp_path))
