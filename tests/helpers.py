"""Test helpers (importable as ``helpers``: pytest puts tests/ on sys.path): tiny configs that run in a second or two on a laptop CPU."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "suites" / "smoke.yaml"
@contextlib.contextmanager
def as_clean_tree():
    """Runs inside record a clean tree at the checked-out commit, as in CI's clean checkout, so a
    test of what a leaderboard shows of clean entries holds while a developer has changes (the
    tests of dirty trees are in test_leaderboard_dirty.py)."""
    import pytest

    from clbench.results import provenance

    head = provenance.head_commit(provenance.code_repo())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(provenance, "git_state", lambda: (head, False if head else None))
        yield


def checked(target, where: str = "benchmark.init_args", **init_args):
    """``target(**init_args)`` after the check a run makes of them first (their annotations)."""
    from clbench.plugins.build import check_init_args

    check_init_args(target, init_args, where)
    return target(**init_args)


def smoke(**changes) -> dict:
    """The smoke suite as a dict, with top-level keys replaced."""
    import yaml

    data = yaml.safe_load(SMOKE.read_text())
    data.update(changes)
    return data


def write_suite(folder: Path, data: dict, name: str = "suite.yaml") -> Path:
    import yaml

    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tiny_config(**overrides) -> dict:
    """A raw config (before resolution) for a 3-domain digits stream, one epoch, a small MLP."""
    from clbench.config.load import deep_merge

    base = {
        "seed": 0,
        "benchmark": {"class_path": "digits-domains", "init_args": {"domains": ["rot0", "rot90", "rot180"]}},
        "model": {"class_path": "mlp", "init_args": {"hidden": 32}},
        "strategy": {"class_path": "naive"},
        "train": {"epochs": 1, "batch_size": 64, "optimizer": {"class_path": "adam", "init_args": {"lr": 0.01}}},
        "logging": {"progress": False, "tensorboard": False},
    }
    return deep_merge(base, overrides)


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 300):
    """``python -m clbench.cli.main ARGS`` in a subprocess; returns the CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "clbench.cli.main", *args], cwd=cwd or REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


# Python's own warning filters in a new process (``python -m clbench.cli.main`` with no -W options),
# oldest last, as ``warnings.filters`` lists them: what a user's terminal shows.
_FRESH_PROCESS_FILTERS = (("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, ""),
                          ("ignore", PendingDeprecationWarning, ""), ("ignore", ImportWarning, ""),
                          ("ignore", ResourceWarning, ""))


@contextlib.contextmanager
def process_state_kept(*folders: Path):
    """Undo what a command run inside the test process changes in it: warning filters and
    handlers, logger levels and handlers, torch threads, random generators, the environment, the
    working folder, and modules imported from files under ``folders`` (a user's plugin files)."""
    import random

    import numpy as np
    import torch

    logger_state = [(lg, lg.level, list(lg.handlers), lg.propagate, lg.disabled) for lg in _loggers()]
    threads, interop = torch.get_num_threads(), torch.get_num_interop_threads()
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    environ, cwd, path = dict(os.environ), os.getcwd(), list(sys.path)
    try:
        with warnings.catch_warnings():
            yield
    finally:
        for lg, level, handlers, propagate, disabled in logger_state:
            lg.setLevel(level)
            lg.handlers[:] = handlers
            lg.propagate, lg.disabled = propagate, disabled
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        assert torch.get_num_interop_threads() == interop, "the command changed torch's inter-op threads"
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        sys.path[:] = path
        roots = [Path(folder).resolve() for folder in folders]
        for name, module in list(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if file and any(Path(file).resolve().is_relative_to(root) for root in roots):
                del sys.modules[name]


def _loggers() -> list[logging.Logger]:
    return [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                    if isinstance(lg, logging.Logger)]


def _stream_handlers() -> list[logging.StreamHandler]:
    return [h for lg in _loggers() for h in lg.handlers if type(h) is logging.StreamHandler]


@dataclasses.dataclass
class Outcome:
    """What a command did, in the shape of ``subprocess.CompletedProcess``."""

    returncode: int
    stdout: str
    stderr: str


def cli_in_process(capfd, *args: str, folders: tuple[Path, ...] = ()) -> Outcome:
    """``clbench ARGS`` through the console script's own function, :func:`clbench.cli.main.main`, in
    this process: the exit status it returns or exits with, and everything written to file
    descriptors 1 and 2 meanwhile (``capfd``, a pytest fixture). The warnings a new process would
    print are added to stderr as Python prints them; an exception that escapes ``main`` is
    status 1 and its traceback, as the interpreter would report it. Run from the repository
    root, with the process state restored afterwards (:func:`process_state_kept`).

    What only a new process shows (warnings at import, exit through the interpreter) needs
    :func:`run_cli`."""
    from clbench.cli.main import main

    capfd.readouterr()  # drop whatever came before
    with process_state_kept(*folders), warnings.catch_warnings(record=True) as shown:
        warnings.resetwarnings()
        for action, category, module in reversed(_FRESH_PROCESS_FILTERS):
            warnings.filterwarnings(action, category=category, module=module)
        os.environ.pop("CLBENCH_SHOW_WARNINGS", None)
        saved_options, sys.warnoptions[:] = list(sys.warnoptions), []
        os.chdir(REPO)
        # A handler made when its library was imported holds the sys.stderr of that moment (a
        # capture of pytest's by now): point it at this command's stderr, as in a new process.
        # (Assigned, not setStream: that flushes the old stream, which may be closed.)
        moved = [(handler, handler.stream) for handler in _stream_handlers()
                 if handler.stream not in (sys.stdout, sys.stderr)]
        for handler, _ in moved:
            handler.stream = sys.stderr
        # pytest's log capture (on the root logger and every non-propagating one) would swallow
        # what a new process prints through a library's handler or Python's last resort.
        for logger in _loggers():
            logger.handlers[:] = [h for h in logger.handlers if not type(h).__module__.startswith("_pytest")]
        logging.getLogger().setLevel(logging.WARNING)
        call_streams = {id(sys.stdout): sys.__stdout__, id(sys.stderr): sys.__stderr__}
        try:
            status = main(list(args))
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            if exit_.code is not None and not isinstance(exit_.code, int):
                print(exit_.code, file=sys.stderr)
        except Exception:  # noqa: BLE001  (what the interpreter would print)
            traceback.print_exc()
            status = 1
        finally:
            sys.warnoptions[:] = saved_options
            for handler, stream in moved:
                handler.stream = stream
            # A handler a library made during the command stays, writing where it would outside.
            for handler in _stream_handlers():
                handler.stream = call_streams.get(id(handler.stream), handler.stream)
    captured = capfd.readouterr()
    printed = "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in shown)
    return Outcome(status, captured.out, captured.err + printed)


def default_sigint() -> None:
    """``preexec_fn`` for a child that must take Ctrl-C: a shell running the tests in the
    background starts them with SIGINT ignored, and Python only installs its KeyboardInterrupt
    handler where SIGINT is not ignored at start-up."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Crash(Exception):
    """Stands in for SIGKILL inside the test process."""


def crash_at(monkeypatch, point: str, cfg: dict, output: Path) -> None:
    """Run ``cfg`` into ``output`` in this process and stop it dead at fault ``point``
    (:mod:`clbench.engine.faults` syntax, e.g. ``stage:2:step:5``), leaving what a killed
    process leaves: its last checkpoint. The one crash helper of the in-process tests; a
    subprocess is killed for real with :func:`kill_env`."""
    import pytest

    from clbench.engine import faults
    from clbench.engine.runner import run

    def die() -> None:
        raise Crash

    monkeypatch.setattr(faults, "die", die)
    monkeypatch.setenv(faults.ENV, point)
    with pytest.raises(Crash):
        run(cfg, output)
    monkeypatch.delenv(faults.ENV)


def kill_env(point: str | None, env: dict | None = None, *, signal: str | None = None) -> dict:
    """The environment of a ``clbench`` subprocess that kills itself at fault ``point`` (SIGKILL,
    or ``signal="INT"`` for Ctrl-C); ``env`` is the rest (default: this process's), any kill
    point it inherits removed first. ``point=None``: a run that is not killed."""
    from clbench.engine.faults import ENV, SIGNAL_ENV

    out = {k: v for k, v in (os.environ if env is None else env).items() if k not in (ENV, SIGNAL_ENV)}
    if point is not None:
        out[ENV] = point
    if signal is not None:
        out[SIGNAL_ENV] = signal
    return out


# -- shared by several test folders ------------------------------------------------------
def make_experience(position: int, labels, dim: int = 4, seed: int = 0):
    """An experience whose inputs carry (position, index) in their first two features."""
    import torch

    from clbench.data.datasets import ArrayDataset
    from clbench.data.streams import Experience

    g = torch.Generator().manual_seed(seed + 100 * position)
    y = torch.as_tensor(labels, dtype=torch.long)
    x = torch.randn(len(y), dim, generator=g)
    x[:, 0] = position
    x[:, 1] = torch.arange(len(y), dtype=torch.float)
    ds = ArrayDataset(x, y)
    return Experience(position=position, name=f"e{position}", domain_id=position,
                      classes=sorted(set(y.tolist())), train=ds, test=ds)


#: A two-layer Qwen3 small enough to decode in milliseconds (the causal-LM objective's tests).
TINY_LM = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "intermediate_size": 128, "max_position_embeddings": 256}


def tiny_lm():
    """:data:`TINY_LM` with random weights (seed 0) and the trace-mini tokenizer, in eval mode."""
    import torch

    from clbench.models.lm.causal_lm import hf_causal_lm

    torch.manual_seed(0)
    return hf_causal_lm(architecture="qwen3", tokenizer="trace-mini", config=TINY_LM).eval()


def lm_objective(model, **init_args):
    """The causal-LM objective with ``init_args`` (checked as a run checks them), set up on an
    empty stream and attached to ``model``."""
    from clbench.data.streams import StreamSpec
    from clbench.objectives.causal_lm import CausalLanguageModeling

    objective = checked(CausalLanguageModeling, "objective.init_args", **init_args)
    objective.setup(StreamSpec(name="t", objective="causal_lm"), [])
    objective.attach(model)
    return objective


def tiny_model(dim: int = 4, classes: int = 4, seed: int = 0):
    """A two-layer classifier for the classic strategies' tests."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(dim, 8), nn.Tanh(), nn.Linear(8, classes))


def fake_entry(strategy: str, order, seed: int, acc: float, benchmark: str = "digits-domains",
               higher_is_better: bool = True, percent: bool | None = None) -> dict:
    """An entry as the runner would write it, whose R gives final mean ``acc``.

    R = [[best, 0.5], [acc, acc]] with best = 1 (0 for errors), so ``forgetting`` is ``1 - acc``
    for accuracies and ``acc`` for errors; every score is the one ``cl_scores`` gives, so the
    entry verifies when it is read back. ``percent`` (errors only): record R's metric ``err``
    and whether it is a percentage, as a run does; None records no unit (older entries).
    """
    from clbench.config.load import SCHEMA_VERSION, config_hash, order_label, resolve_config
    from clbench.leaderboard import entries as E
    from clbench.metrics import cl_scores

    cfg = resolve_config({"seed": seed, "strategy": strategy, "order": order, "benchmark": benchmark,
                          "logging": {"tensorboard": False}})
    r_matrix = [[1.0 if higher_is_better else 0.0, 0.5], [acc, acc]]
    r_init = [0.1, 0.1]
    result = {"schema": SCHEMA_VERSION, "status": "ok",
              "benchmark": {"name": benchmark, "init_args": {}, "scenario_type": "domain-il", "num_classes": 10},
              "model": {"name": "mlp", "init_args": {}, "params_total": 10, "params_trainable": 10},
              "strategy": {"name": strategy, "params": {}}, "seed": seed, "order": order,
              "order_label": order_label(order), "experiences": ["a", "b"], "r_matrix": r_matrix,
              "r_init": r_init, "scores": cl_scores(r_matrix, r_init, higher_is_better=higher_is_better),
              "config": cfg, "config_hash": config_hash(cfg),
              "env": {"git_commit": None, "device": "cpu"}, "compute": {"wall_seconds": 1.0}}
    if not higher_is_better:
        result["r_metric"] = {"names": ["err", "err"], "higher_is_better": False}
        if percent is not None:
            result["metrics"] = {"err": {"title": "Err", "higher_is_better": False, "percent": percent,
                                         "class": "clbench.metrics.regression:SquaredError"}}
    return E.entry_from_result(result)


def typed_entries(documents: list[dict]) -> list:
    """Entries held in memory as tables read them from a folder: each checked against, and read
    as, its typed model (:func:`clbench.leaderboard.schema.validate_entry`)."""
    from clbench.leaderboard.schema import validate_entry

    return [validate_entry(d, "entry", "fix the test's entry") for d in documents]
