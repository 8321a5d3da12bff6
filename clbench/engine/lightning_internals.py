"""Every place clbench touches Lightning's private API, in one module.

Lightning's public API covers running a Trainer, not driving one across many ``fit`` calls
the way a continual run does, so a few needs are met through names Lightning keeps private.
Each is a function here, with why the public API does not suffice and the Lightning versions
it was checked against (the sources of 2.4.0, 2.5.0 and 2.6.0, and the installed 2.6.6); each
has a test in ``tests/engine/test_lightning_internals.py`` that fails when Lightning changes it, so an
upgrade that breaks one shows up there, named, rather than as a wrong resume. Nothing else in
clbench imports a private Lightning name or reads a private attribute of a Lightning object.

Lightning is imported inside each function: importing this module costs nothing.
"""

from __future__ import annotations

from typing import Any


def clear_restart_flags(trainer) -> None:
    """Make the Trainer's loops, just loaded from a state dict, behave as the uninterrupted
    Trainer's would between two ``fit`` calls rather than as a mid-epoch restart.

    Why private: ``fit_loop.load_state_dict`` raises the loops' restart flags (``restarting``,
    ``_loaded_from_state_dict``, ``_resuming_from_checkpoint``) and nothing public lowers them;
    ``_Loop.on_iteration_done`` is what Lightning itself calls when an iteration ends. The nested loops are found as the ``_Loop`` instances among each loop's attributes.
    Checked on: 2.5.0 to 2.6.6. Lightning 2.4.0 has no ``on_iteration_done``, hence ``lightning>=2.5``.
    """
    from lightning.pytorch.loops.loop import _Loop

    loops = [trainer.fit_loop]
    while loops:
        loop = loops.pop()
        loop.on_iteration_done()
        loops.extend(v for v in vars(loop).values() if isinstance(v, _Loop))


def starts_processes_per_fit(trainer) -> bool:
    """Whether the Trainer's strategy starts new processes at every ``fit`` (``ddp_spawn``,
    ``ddp_fork``, ``ddp_notebook``), which a run that fits once per experience cannot use.

    Why private: the launcher class that does so has no public name, and no public property
    says whether a strategy's processes outlive a ``fit``. If a later Lightning renames the
    class the check is skipped (False), not every run broken.
    Checked on: 2.4.0 to 2.6.6 (``lightning.pytorch.strategies.launchers._MultiProcessingLauncher``).
    """
    try:
        from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher
    except ImportError:
        return False
    return isinstance(trainer.strategy.launcher, _MultiProcessingLauncher)


def attached_trainer(module) -> Any:
    """The Trainer a LightningModule is attached to, or None.

    Why private: the public ``LightningModule.trainer`` raises when no Trainer is attached (a
    module a strategy uses outside a ``fit``, a reference model being built); ``_trainer`` is
    what that property reads. Checked on: 2.4.0 to 2.6.6.
    """
    return module._trainer


def open_writer(logger) -> Any:
    """A TensorBoard logger's event writer if it is open, else None (without opening one).

    Why private: the public ``TensorBoardLogger.experiment`` creates the writer when none is open
    (and a new event file with it); flushing at the end of each ``fit`` must not. ``_experiment``
    is what that property caches. Checked on: 2.4.0 to 2.6.6.
    """
    return logger._experiment


def launch_processes(trainer, module) -> None:
    """Start the run's other processes and each process's group now, as ``Trainer.fit`` does
    first: its launcher starts the other ranks, and every rank connects the module to the
    strategy and sets up its environment (without a launcher, this process alone does).

    Why private: the Trainer does this only inside ``fit``/``validate`` (its private
    ``_call_and_handle_interrupt`` and ``_run``); a resumed run needs the group before either
    (see :func:`clbench.engine.trainer.start_process_group`). ``Strategy.connect`` and the
    launcher's ``launch(function, *args, trainer=...)`` are public methods, but of the private
    launcher protocol (``_Launcher``), whose signature is Lightning's to change.
    Checked on: 2.4.0 to 2.6.6.
    """
    trainer.strategy.connect(module)  # as fit does first (the fsdp strategy hands the module its mesh)
    launcher = trainer.strategy.launcher
    if launcher is None:
        trainer.strategy.setup_environment()
    else:  # starts the other ranks from rank 0 (they re-run the command), then the group on each
        launcher.launch(trainer.strategy.setup_environment, trainer=trainer)
