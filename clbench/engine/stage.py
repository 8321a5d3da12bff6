"""One stage of training and one evaluation pass, as every caller runs them.

:func:`fit_stage` is the plain training of every caller: the runner's experiences, the reference
models and pre-training each train a module for some epochs on one loader with it, and
:func:`evaluate` is every evaluation pass; both return what the passes produced
(:class:`~clbench.engine.evaluation.Evaluation`), never leave it on the module. ``watch`` (a
:class:`~clbench.engine.trainer.SigintWatch`) stops the run after a pass when Ctrl-C came during it.
"""

from __future__ import annotations

from clbench.engine.evaluation import Evaluation, evaluation_log
from clbench.engine.trainer import interruptible


def evaluate(trainer, module, loaders: list, *, watch=None) -> Evaluation:
    """One evaluation pass of ``module`` over ``loaders`` (one per test column)."""
    interruptible(trainer, trainer.validate, module, loaders, verbose=False)
    if watch is not None:
        watch.check()
    return evaluation_log(trainer).take()[-1]


def fit_stage(trainer, module, loader, epochs: int, *, watch=None, val_loaders: list | None = None) -> list[Evaluation]:
    """Train ``module`` for ``epochs`` more epochs on ``loader`` with ``trainer`` (one stage: a
    fresh optimizer, the scheduler sized to the stage's steps, :meth:`ContinualModule.configure_optimizers`);
    the evaluation passes run inside (with ``val_loaders``, one per epoch) come back in order."""
    trainer.fit_loop.max_epochs = trainer.current_epoch + epochs
    interruptible(trainer, trainer.fit, module, train_dataloaders=loader, val_dataloaders=val_loaders)
    if watch is not None:
        watch.check()
    return evaluation_log(trainer).take()


def fit_plain(parts, model, dataset, stage: object, epochs: int, *, columns: list | None = None, watch=None):
    """Train ``model`` as a plain (naive) learner on ``dataset`` with a Trainer of its own, seeded
    as the run's stage ``stage`` (:class:`~clbench.seeding.Seeds`): pretraining and the
    reference models. Returns the Trainer and the module, whose ``columns`` a pass can then score."""
    from clbench.engine.module import ContinualModule
    from clbench.engine.trainer import make_trainer
    from clbench.strategy import Strategy

    module = ContinualModule(model, Strategy(), parts.objective, optimizer=parts.optimizer,
                             scheduler=parts.scheduler, columns=columns or [None])
    trainer = make_trainer(parts.cfg, parts.source)
    parts.seeds.train(stage)
    loader = parts.loader(dataset, trainer, shuffle=True, seed=parts.seeds.loader(stage))
    fit_stage(trainer, module, loader, epochs, watch=watch)
    return trainer, module
