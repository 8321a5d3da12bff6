"""One stage of training and one evaluation pass, as every caller runs them.

:func:`fit_stage` is the plain training of every caller: the runner's experiences, the reference
models and pre-training each train a module for some epochs on one loader with it, and
:func:`evaluate` is every evaluation pass; both return what the passes produced
(:class:`~clbench.engine.evaluation.Evaluation`), never leave it on the module.
"""

from __future__ import annotations

from clbench.engine.evaluation import Evaluation, evaluation_log
from clbench.engine.trainer import interruptible, optimizer_steps


def evaluate(run, trainer, module, loaders: list) -> Evaluation:
    """One evaluation pass of ``module`` over ``loaders`` (one per test column)."""
    interruptible(trainer, trainer.validate, module, loaders, verbose=False)
    run.watch.check()
    return evaluation_log(trainer).take()[-1]


def fit_stage(run, trainer, module, loader, epochs: int, *, val_loaders: list | None = None) -> list[Evaluation]:
    """Train ``module`` for ``epochs`` more epochs on ``loader`` with ``trainer`` (one stage: a
    fresh optimizer, the scheduler sized to the stage's steps); the evaluation passes run inside
    (with ``val_loaders``, one per epoch) come back in order."""
    # the scheduler's length: this stage's optimizer steps (unknown without a loader length)
    module.stage_steps = None if module.make_scheduler is None else optimizer_steps(trainer, loader, epochs)
    trainer.fit_loop.max_epochs = trainer.current_epoch + epochs
    interruptible(trainer, trainer.fit, module, train_dataloaders=loader, val_dataloaders=val_loaders)
    run.watch.check()
    return evaluation_log(trainer).take()
