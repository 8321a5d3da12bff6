"""The strategy plugin API: :class:`Strategy`, and the :class:`StrategyContext` its hooks receive.

A strategy is a subclass of :class:`Strategy`. The harness owns the loop: for each experience
the runner calls ``adapt_model`` and ``before_experience``, builds the training data through
``train_dataset`` and ``train_loader``, lets a Lightning ``Trainer`` fit the model (calling
``prepare_batch``, ``training_loss`` and the step hooks from the matching Lightning hooks),
evaluates, and then calls ``after_experience``. Every hook has a do-nothing default, so a method
overrides only what it changes; a whole method fits in one short file.

Hooks, in the order they run::

    setup(ctx, experiences, seed)              once, after the model is built
    adapt_model(ctx, upto=0)                   structure before any training (r_init is evaluated on it)
    per experience i (run order):
        adapt_model(ctx, upto=i + 1)           structure experience i trains
        before_experience(ctx, exp)
        train_dataset(exp) -> Dataset
        train_loader(ctx, dataset, make_loader) -> loader (or a CombinedLoader)
        per step:  prepare_batch -> objective forward (+ auxiliary losses) -> objective loss
                   -> training_loss -> backward -> after_backward -> before_optimizer_step
                   -> optimizer step -> after_optimizer_step
                   (or update(ctx, batch) alone, for a strategy that sets ``owns_update``)
        (evaluation on every test experience: each batch inside evaluating(ctx, column))
        after_experience(ctx, exp)
    state_dict() after every experience (the checkpoint); on resume: load_state_dict(state),
    then adapt_model(ctx, upto=experiences finished) before the checkpoint's weights load.

Event hooks are named ``before_X`` / ``after_X`` (``before_experience``/``after_experience``,
``after_backward``, ``before_optimizer_step``/``after_optimizer_step``); the others give
something (``train_dataset``, ``train_loader``, ``prepare_batch``, ``training_loss``,
``evaluating``, ``update``, ``state_dict``) or read what the strategy is (``hparams``,
``diagnostics``).

``ctx`` (:class:`StrategyContext`) holds what a hook may use of the run: the network
(``ctx.model``), the stream's objective (``ctx.objective``: a strategy that needs the task loss of
another batch asks ``ctx.objective.loss_of(model, inputs, targets)`` rather than assuming
cross-entropy), the device, the process's rank, the experience being trained and the optimizer
factories. Importing only :mod:`clbench`'s public API (the names in ``clbench.__all__`` and the
modules in ``clbench.PUBLIC_MODULES``) keeps a strategy working across the engine's changes.

Changing the model's structure (injecting adapters, widening layers, adding a task's parameters)
happens in :meth:`adapt_model` and nowhere else: the harness replays it on resume (from the
strategy's restored state) and before parameters are sharded, so one method keeps the model and
the strategy's record of it consistent. A change made in the middle of an experience calls
``ctx.rebuild_optimizer()`` afterwards; between experiences nothing is needed (every experience
builds its optimizer afresh).

State: ``state_dict`` / ``load_state_dict`` must hold everything needed to continue after a
crash (buffers, Fisher matrices, teacher weights, what :meth:`adapt_model` must replay) as tensors
and plain Python values only, so a checkpoint loads with ``torch.load(weights_only=True)``.

Hyper-parameters are the ``__init__`` arguments; give each a type annotation and a default, and
document it. The config's ``strategy.init_args`` is checked against that signature.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, ContextManager

import torch

from clbench.errors import UserError

if TYPE_CHECKING:
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    from clbench.data.streams import Experience
    from clbench.metrics.declared import MetricSpec
    from clbench.objectives.base import Objective

#: What a strategy may declare in :attr:`Strategy.requires`, and what provides it.
REQUIREMENTS: dict[str, str] = {
    "classification": "an objective that scores class predictions (objective: classification)",
    "language_model": "a causal language model and its objective (objective: causal_lm)",
    "regression": "an objective that scores real-valued predictions (objective: regression)",
}

#: Hooks of earlier versions, and what replaced them (a plugin that still defines one is refused).
RENAMED_HOOKS: dict[str, str] = {
    "on_after_backward": "after_backward", "on_before_optimizer_step": "before_optimizer_step",
    "on_after_optimizer_step": "after_optimizer_step", "before_sharding": "adapt_model",
    "restore_model": "adapt_model",
}


@dataclass(eq=False)
class StrategyContext:
    """What a strategy's hooks receive: the parts of the run a method may read or change.

    The harness keeps one per run and updates it as the run goes (``experience`` before each
    experience; ``device``, ``rank`` and ``world_size`` once the Trainer runs), so a strategy may
    keep a reference to it.
    """

    #: The network being trained (an ``nn.Module``; :class:`clbench.ContinualModel` lists what it may offer).
    model: "nn.Module"
    #: The stream's objective: ``split``, ``forward``, ``loss_of``, ``collate`` (:class:`clbench.Objective`).
    objective: "Objective"
    #: ``make_optimizer(params)``: the configured optimizer over ``params`` (e.g. for a probe copy).
    make_optimizer: Callable[[list], torch.optim.Optimizer]
    #: ``rebuild_optimizer()``: rebuild the run's optimizer over the current trainable
    #: parameters, after a change to them in the middle of an experience (no-op outside ``fit``).
    rebuild_optimizer: Callable[[], None]
    #: Position (in run order) of the experience being trained; 0 before the first.
    experience: int = 0
    #: Where training runs (a run keeps the model there; outside a run, Lightning moves it to the CPU after fit).
    device: torch.device = torch.device("cpu")
    #: This process's global rank and the number of processes (data parallelism).
    rank: int = 0
    world_size: int = 1


class Strategy:
    """Base class of every strategy plugin; the defaults give plain fine-tuning (naive)."""

    #: Scenario types the method is meant for; checked against the stream before a run.
    supports: ClassVar[frozenset[str]] = frozenset({"domain-il", "class-il", "instance-il", "task-il"})
    #: What the method needs of the objective and model (keys of :data:`REQUIREMENTS`); a config
    #: that cannot give it is refused before the stream is built.
    requires: ClassVar[frozenset[str]] = frozenset()
    #: Whether the method is correct under data-parallel training (DDP) as written.
    supports_distributed: ClassVar[bool] = True
    #: Whether it also works with sharded parameters (``trainer.strategy: fsdp``): a method that
    #: reads or copies whole parameter tensors (Fisher, teachers, gradient projection) says False.
    #: True only where a test runs the method sharded.
    supports_sharded: ClassVar[bool] = False
    #: Train once on the union of all experiences instead of one experience at a time (joint).
    single_stage: ClassVar[bool] = False
    #: Perform every training step in :meth:`update` (Lightning manual optimisation).
    owns_update: ClassVar[bool] = False
    #: Metrics the method adds to every test column, beside the objective's, each declared with
    #: :func:`clbench.metrics.declared.declare` (its title, direction and unit). Each is updated
    #: with the objective's ``(outputs, targets)`` and reported as ``<name>_final`` (and
    #: ``global_<name>``) in ``result.json``.
    extra_metrics: ClassVar[tuple["MetricSpec", ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for old, new in RENAMED_HOOKS.items():
            if old in vars(cls):
                raise UserError(f"strategy {cls.__qualname__} defines {old}(), a hook that no longer exists",
                                fix=f"rename it {new}() (see docs/strategies.md, 'Writing a strategy')")
        unknown = set(cls.requires) - set(REQUIREMENTS)
        if unknown:
            raise UserError(f"strategy {cls.__qualname__} requires {', '.join(sorted(unknown))}, which is not "
                            "something a run can provide", fix=f"use some of: {', '.join(REQUIREMENTS)} in requires")

    def __init__(self) -> None:
        self.experiences: list[Experience] = []  # the whole stream, in run order (set in setup)
        self.seed: int = 0

    # -- set-up ---------------------------------------------------------------------------
    def setup(self, ctx: StrategyContext, experiences: list["Experience"], seed: int) -> None:
        """Once, after the model is built and before anything else. Keep a handle on the stream
        and a seed; check the model (refuse one the method cannot use)."""
        self.experiences = experiences
        self.seed = seed

    def adapt_model(self, ctx: StrategyContext, upto: int) -> None:
        """Give ``ctx.model`` the structure that training experiences ``0 .. upto - 1`` needs
        (``upto = 0``: before any training), creating only what is missing.

        The one place a strategy changes the model's structure. The harness calls it after
        :meth:`setup` with 0, before experience ``i`` trains with ``i + 1``, on resume with the
        number of experiences the checkpoint finished (after :meth:`load_state_dict`, before its
        weights load: replay what the state records), and, under sharded parameters, once with
        ``len(experiences)`` before the model is sharded (no parameter can be added later; which
        parameters require gradients is put back afterwards). Set what trains here or in
        :meth:`before_experience`.
        """

    def hparams(self) -> dict[str, Any]:
        """The ``__init__`` arguments as set (recorded in results as ``strategy.params``)."""
        out = {}
        for name in inspect.signature(type(self).__init__).parameters:
            if name != "self" and hasattr(self, name):
                value = getattr(self, name)
                out[name] = value if isinstance(value, (int, float, str, bool, type(None), list)) else str(value)
        return out

    def diagnostics(self) -> dict[str, Any]:
        """What the strategy measured about itself during the run, e.g. per stage (recorded in
        results as ``strategy.diagnostics`` when not empty; keep it in ``state_dict`` so a
        resumed run reports every stage). Default: nothing."""
        return {}

    # -- per experience -------------------------------------------------------------------
    def before_experience(self, ctx: StrategyContext, experience: "Experience") -> None:
        """Before training on ``experience`` (freeze, snapshot a teacher, ...)."""

    def train_dataset(self, experience: "Experience") -> "Dataset":
        """The data to train on for ``experience`` (default: its own training split)."""
        return experience.train

    def train_loader(self, ctx: StrategyContext, dataset: "Dataset",
                     make_loader: Callable[..., "DataLoader"]) -> Any:
        """The training loader; ``make_loader(dataset, **overrides)`` gives the configured one."""
        return make_loader(dataset)

    def after_experience(self, ctx: StrategyContext, experience: "Experience") -> None:
        """After training and evaluation on ``experience`` (update buffers, Fisher, ...)."""

    def evaluating(self, ctx: StrategyContext, column: "Experience | None") -> ContextManager[None]:
        """A context around the evaluation of each batch of test column ``column`` (the
        experience it scores; ``None``: a stream-wide test set), for a method that must know
        which task is evaluated (a task-incremental oracle). Default: nothing."""
        return contextlib.nullcontext()

    # -- per step -------------------------------------------------------------------------
    def prepare_batch(self, ctx: StrategyContext, batch: Any) -> tuple[Any, Any]:
        """Turn what the loader yields into ``(inputs, targets)`` (default: the objective's split)."""
        return ctx.objective.split(batch)

    def training_loss(self, ctx: StrategyContext, x: Any, y: Any, logits: Any,
                      loss: torch.Tensor) -> torch.Tensor:
        """The loss to minimise, given the task loss: ``x``/``y`` are the batch's inputs and
        targets, ``logits`` the model's outputs (add regularisers here)."""
        return loss

    def update(self, ctx: StrategyContext, batch: Any) -> torch.Tensor:
        """One training step of a strategy with ``owns_update`` (closed-form or other non-SGD
        learners); returns the (detached) loss."""
        raise NotImplementedError(f"{type(self).__name__} sets owns_update but does not define update()")

    def after_backward(self, ctx: StrategyContext) -> None:
        """Gradients of this backward pass are in ``p.grad``; mask them here. A method that needs
        the whole step's gradient (after gradient accumulation), such as A-GEM's projection,
        uses :meth:`before_optimizer_step` instead."""

    def before_optimizer_step(self, ctx: StrategyContext, optimizer: torch.optim.Optimizer) -> None:
        """Just before ``optimizer.step()``."""

    def after_optimizer_step(self, ctx: StrategyContext) -> None:
        """Just after ``optimizer.step()`` (per-step importance as in Synaptic Intelligence)."""

    # -- resume ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Tensors and plain Python values needed to continue after ``after_experience``."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict` (then :meth:`adapt_model` replays the structure)."""
