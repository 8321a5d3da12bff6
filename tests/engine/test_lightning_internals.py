"""One test per private Lightning name clbench relies on (:mod:`clbench.engine.lightning_internals`).

Each fails when Lightning changes what that function relies on, so an upgrade that breaks one
is reported here by name. The last test checks that the module is the only place that touches
Lightning's private API.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from clbench.engine import lightning_internals as internals


ROOT = Path(__file__).resolve().parents[2]


def _trainer(**kw):
    import lightning.pytorch as pl

    args = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False)
    return pl.Trainer(**{**args, **kw})


def _loops(trainer) -> list:
    from lightning.pytorch.loops.loop import _Loop

    found, stack = [], [trainer.fit_loop]
    while stack:
        loop = stack.pop()
        found.append(loop)
        stack.extend(v for v in vars(loop).values() if isinstance(v, _Loop))
    return found


def _restart_flags(loop) -> list[str]:
    """The flags by which a loaded loop restarts mid-epoch (the last two since Lightning 2.5)."""
    return [name for name in ("restarting", "_loaded_from_state_dict", "_resuming_from_checkpoint")
            if getattr(loop, name, False)]


def test_clear_restart_flags_makes_a_loaded_fit_loop_continue_with_a_whole_epoch():
    from lightning.pytorch.demos.boring_classes import BoringModel

    first = _trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0)
    first.fit(BoringModel())
    state = first.fit_loop.state_dict()
    assert first.global_step == 2

    model = BoringModel()
    second = _trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0)
    second.fit_loop.load_state_dict(state)
    assert len(_loops(second)) > 2  # fit, epoch and optimization loops
    assert any(_restart_flags(loop) for loop in _loops(second))  # what loading raises
    internals.clear_restart_flags(second)
    assert not any(_restart_flags(loop) for loop in _loops(second))
    assert second.current_epoch == 1 and second.global_step == 2
    second.fit_loop.max_epochs = 2
    second.fit(model)
    assert second.current_epoch == 2 and second.global_step == 4  # one whole epoch more, as uninterrupted


def test_starts_processes_per_fit_names_the_spawning_strategies_only():
    assert internals.starts_processes_per_fit(_trainer(devices=2, strategy="ddp_spawn"))
    assert not internals.starts_processes_per_fit(_trainer(devices=2, strategy="ddp"))
    assert not internals.starts_processes_per_fit(_trainer())


def test_attached_trainer_is_none_where_the_public_property_raises():
    import lightning.pytorch as pl

    module = pl.LightningModule()
    assert internals.attached_trainer(module) is None
    with pytest.raises(RuntimeError, match="not attached"):
        module.trainer  # noqa: B018  (why the private attribute is read)
    trainer = _trainer()
    module.trainer = trainer
    assert internals.attached_trainer(module) is trainer


def test_launch_processes_connects_the_module_and_the_launcher_takes_a_function_and_the_trainer():
    from lightning.pytorch.demos.boring_classes import BoringModel

    trainer, module = _trainer(), BoringModel()
    assert trainer.strategy.launcher is None
    internals.launch_processes(trainer, module)
    assert trainer.strategy.lightning_module is module
    launcher = _trainer(devices=2, strategy="ddp").strategy.launcher  # started only at a fit: not here
    params = inspect.signature(type(launcher).launch).parameters
    assert list(params)[:2] == ["self", "function"] and "trainer" in params


def test_open_writer_reads_the_cached_tensorboard_writer_without_opening_one(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger

    logger = TensorBoardLogger(save_dir=str(tmp_path), name="tb", version="")
    assert internals.open_writer(logger) is None and not any(tmp_path.rglob("events.*"))
    writer = logger.experiment
    assert internals.open_writer(logger) is writer


def _private_lightning_touches(path: Path) -> list[str]:
    """Private names imported from Lightning, and ``._name`` read on anything, in one file."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("lightning", "pytorch_lightning"):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Attribute) and node.attr in ("_trainer", "_mode", "_Loop", "_MultiProcessingLauncher",
                                                                     "_experiment"):
            found.append(node.attr)
    return found


def test_no_other_module_touches_lightning_internals():
    files = list((ROOT / "clbench").rglob("*.py"))
    touches = {str(p.relative_to(ROOT)): t for p in files if (t := _private_lightning_touches(p))}
    assert set(touches) == {"clbench/engine/lightning_internals.py"}, touches
