"""The strategy plugin API.

A strategy is a subclass of :class:`Strategy`. The harness owns the loop: for each experience
the runner calls ``before_experience``, builds the training data through ``train_dataset`` and
``train_loader``, lets a Lightning ``Trainer`` fit the :class:`~clbench.engine.module.ContinualModule`
(which calls ``prepare_batch``, ``training_loss``, ``on_after_backward`` and
``on_before_optimizer_step`` from the matching Lightning hooks), evaluates, and then calls
``after_experience``. Every hook has a do-nothing default, so a method overrides only what it
changes; a whole method fits in one short file.

Hook order for one experience::

    before_experience(module, exp)
    train_dataset(exp) -> Dataset
    train_loader(module, dataset, make_loader) -> loader (or a CombinedLoader)
    per step:  prepare_batch -> objective forward (+ auxiliary losses) -> objective loss
               -> training_loss -> backward -> on_after_backward -> on_before_optimizer_step
               -> optimizer step -> on_after_optimizer_step
    (evaluation on every test experience: each batch inside evaluating(module, column))
    after_experience(module, exp)

``module.model`` is the network, ``module.objective`` the stream's objective: a strategy that
needs the task loss of another batch (A-GEM's reference gradient, EWC's Fisher) asks
``module.objective.loss_of(model, inputs, targets)`` rather than assuming cross-entropy.

A strategy that adds or reshapes parameters does so in ``before_experience`` (the optimizer is
built afresh at every experience) or calls ``module.rebuild_optimizer()`` after a change made
mid-experience; on resume, :meth:`restore_model` re-creates the changes before the
checkpoint's weights are loaded. A strategy that sets ``owns_update`` performs each step itself
in :meth:`update` (closed-form or other non-SGD learners).

State: ``state_dict`` / ``load_state_dict`` must hold everything needed to continue after a
crash (buffers, Fisher matrices, teacher weights) as tensors and plain Python values only, so a
checkpoint loads with ``torch.load(weights_only=True)``.

Hyper-parameters are the ``__init__`` arguments; give each a type annotation and a default, and
document it. The config's ``strategy.init_args`` is checked against that signature.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import TYPE_CHECKING, Any, Callable, ClassVar, ContextManager

import torch

if TYPE_CHECKING:
    from torch.utils.data import DataLoader, Dataset

    from clbench.engine.module import ContinualModule
    from clbench.data.streams import Experience


class Strategy:
    """Base class of every strategy plugin; the defaults give plain fine-tuning (naive)."""

    #: Scenario types the method is meant for; checked against the stream before a run.
    supports: ClassVar[frozenset[str]] = frozenset({"domain-il", "class-il", "instance-il", "task-il"})
    #: Whether the method is correct under data-parallel training (DDP) as written.
    supports_distributed: ClassVar[bool] = True
    #: Whether it also works with sharded parameters (``trainer.strategy: fsdp``): a method that
    #: reads or copies whole parameter tensors (Fisher, teachers, gradient projection) says False,
    #: and so does one that creates parameters after :meth:`before_sharding` (see
    #: :mod:`clbench.engine.sharding`). True only where a test runs the method sharded.
    supports_sharded: ClassVar[bool] = False
    #: Train once on the union of all experiences instead of one experience at a time (joint).
    single_stage: ClassVar[bool] = False
    #: Perform every training step in :meth:`update` (Lightning manual optimisation).
    owns_update: ClassVar[bool] = False

    def __init__(self) -> None:
        self.experiences: list[Experience] = []  # the whole stream, in run order (set in setup)
        self.seed: int = 0

    # -- set-up ---------------------------------------------------------------------------
    def setup(self, module: "ContinualModule", experiences: list["Experience"], seed: int) -> None:
        """Once, before the first experience. Keep a handle on the stream and a seed."""
        self.experiences = experiences
        self.seed = seed

    def before_sharding(self, module: "ContinualModule") -> None:
        """Just before the model is sharded (``trainer.strategy: fsdp``, at the run's first fit
        or evaluation): create every parameter the rest of the run will need, since none can be
        added to a sharded model."""

    def hparams(self) -> dict[str, Any]:
        """The ``__init__`` arguments as set (recorded in results)."""
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
    def before_experience(self, module: "ContinualModule", experience: "Experience") -> None:
        """Before training on ``experience`` (grow, freeze, snapshot a teacher, ...)."""

    def train_dataset(self, experience: "Experience") -> "Dataset":
        """The data to train on for ``experience`` (default: its own training split)."""
        return experience.train

    def train_loader(self, module: "ContinualModule", dataset: "Dataset",
                     make_loader: Callable[..., "DataLoader"]) -> Any:
        """The training loader; ``make_loader(dataset, **overrides)`` gives the configured one."""
        return make_loader(dataset)

    def after_experience(self, module: "ContinualModule", experience: "Experience") -> None:
        """After training and evaluation on ``experience`` (update buffers, Fisher, ...)."""

    def evaluating(self, module: "ContinualModule", column: "Experience | None") -> ContextManager[None]:
        """A context around the evaluation of each batch of test column ``column`` (the
        experience it scores; ``None``: a stream-wide test set), for a method that must know
        which task is evaluated (a task-incremental oracle). Default: nothing."""
        return contextlib.nullcontext()

    # -- per step -------------------------------------------------------------------------
    def prepare_batch(self, module: "ContinualModule", batch: Any) -> tuple[Any, Any]:
        """Turn what the loader yields into ``(inputs, targets)`` (default: the objective's split)."""
        return module.objective.split(batch)

    def training_loss(self, module: "ContinualModule", x: Any, y: Any, logits: Any,
                      loss: torch.Tensor) -> torch.Tensor:
        """The loss to minimise, given the task loss: ``x``/``y`` are the batch's inputs and
        targets, ``logits`` the model's outputs (add regularisers here)."""
        return loss

    def update(self, module: "ContinualModule", batch: Any) -> torch.Tensor:
        """One training step of a strategy with ``owns_update``; returns the (detached) loss.
        ``module.optimizers()`` is the configured optimizer, if the method wants one."""
        raise NotImplementedError(f"{type(self).__name__} sets owns_update but does not define update()")

    def on_after_backward(self, module: "ContinualModule") -> None:
        """Gradients of this backward pass are in ``p.grad``; mask them here. A method that needs
        the whole step's gradient (after gradient accumulation), such as A-GEM's projection,
        uses :meth:`on_before_optimizer_step` instead."""

    def on_before_optimizer_step(self, module: "ContinualModule", optimizer: torch.optim.Optimizer) -> None:
        """Just before ``optimizer.step()``."""

    def on_after_optimizer_step(self, module: "ContinualModule") -> None:
        """Just after ``optimizer.step()`` (per-step importance as in Synaptic Intelligence)."""

    # -- resume ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Tensors and plain Python values needed to continue after ``after_experience``."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""

    def restore_model(self, module: "ContinualModule", state: dict[str, Any]) -> None:
        """On resume, before the checkpoint's weights load: re-create the layers and shapes this
        strategy added to ``module.model`` (``state`` is what :meth:`state_dict` returned)."""
