"""The LightningModule that wraps a model, one strategy plugin and the stream's objective.

Lightning owns the loop; this module maps Lightning's hooks onto the strategy's and the
objective's, and keeps the evaluation state. It never looks at the kind of data: the
objective says how a batch becomes a loss and how a test batch updates its column's metrics.

One training step::

    inputs, targets = strategy.prepare_batch(ctx, batch)      # default: objective.split(batch)
    outputs = objective.forward(model, inputs)                 # layers may call auxiliary.add
    loss = objective.loss(outputs, targets) + auxiliary terms
    loss = strategy.training_loss(ctx, inputs, targets, outputs, loss)

A strategy that sets ``owns_update`` replaces all of that with its ``update(ctx, batch)``
(Lightning manual optimisation), for learners with closed-form or otherwise non-SGD steps.

Strategy hooks receive the module's :class:`~clbench.strategy.StrategyContext` (``ctx``), never
the module itself: the context is what the plugin API promises, the module is the engine's.

Evaluation is Lightning validation with one dataloader per test experience: ``dataloader_idx``
is the R-matrix column, and each column accumulates into its own torchmetrics collection, so
scores are exact under DDP (states are summed/gathered across ranks, never averaged per rank).
:meth:`compute_columns` turns them into values at the end of a pass; the run's
:class:`~clbench.engine.evaluation.EvaluationLog` callback collects them, and routing is recorded
by the :class:`~clbench.metrics.routing_recording.RoutingRecording` callback, so this module keeps no
record of past passes.

Under data parallelism every rank evaluates as many batches (:class:`clbench.data.datasets.LockstepLoader`):
a rank whose evaluation shard ran out runs :class:`clbench.data.datasets.Padding` batches, which update
nothing. Under ``trainer.strategy: fsdp`` (where every forward is a collective) the model is
sharded in :meth:`configure_model` (:mod:`clbench.engine.sharding`).

Between Lightning calls the module stays where it trains while the run holds it (:meth:`resident`):
Lightning's ``Strategy.teardown`` would otherwise copy the weights and the optimizer state to host
memory after every ``fit`` and evaluation pass, and the next call would copy them back.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any, Callable

import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn

from clbench.models import auxiliary
from clbench.data.datasets import Padding
from clbench.engine.lightning_internals import attached_trainer
from clbench.errors import NonFiniteLoss
from clbench.metrics.stderr import sampling_error
from clbench.objectives.base import Objective
from clbench.plugins.hooks import returned
from clbench.strategy import Strategy, StrategyContext

if TYPE_CHECKING:
    from clbench.engine.state import ColumnValues


class ContinualModule(pl.LightningModule):
    """``model`` + ``strategy`` + ``objective`` + the optimizer spec; evaluates test columns.

    ``columns``: the experience each test column scores (``None`` for a stream-wide test set).
    ``scheduler(optimizer, total_steps)``, when given, is stepped every optimizer step.
    """

    def __init__(self, model: nn.Module, strategy: Strategy, objective: Objective | None = None, *,
                 optimizer: Callable[[Any], torch.optim.Optimizer],
                 scheduler: Callable[[torch.optim.Optimizer, int], Any] | None = None,
                 columns: list | None = None, num_columns: int | None = None, num_classes: int | None = None):
        super().__init__()
        from torchmetrics import MetricCollection

        from clbench.metrics.declared import column_metrics

        if objective is None:  # a bare module (tests, reference models): classification
            from clbench.objectives.classification import Classification
            from clbench.data.streams import StreamSpec

            objective = Classification()
            objective.setup(StreamSpec(name="", num_classes=num_classes), [])
        self.model = model
        self.strategy = strategy
        self.objective = objective
        self.make_optimizer = optimizer
        self.make_scheduler = scheduler
        # What the strategy's hooks see of the run (kept current: experience, device, rank).
        self.context = StrategyContext(model=model, objective=objective,
                                       make_optimizer=lambda params: self.make_optimizer(params),
                                       rebuild_optimizer=self.rebuild_optimizer,
                                       device=next(iter(model.parameters()), torch.zeros(())).device)
        columns = list(columns) if columns is not None else [None] * (num_columns or 1)
        self.columns = columns
        self.eval_metrics = nn.ModuleList()
        self.primary: list[str] = []  # each column's primary metric: its R-matrix entry
        for column in columns:
            metrics = column_metrics(objective, strategy, column)  # the objective's, then those plugins add
            self.primary.append(next(iter(metrics.keys())))
            self.eval_metrics.append(metrics if isinstance(metrics, MetricCollection) else MetricCollection(metrics))
        self.automatic_optimization = not strategy.owns_update
        self._loss_sum = torch.zeros(())
        self._aux_sums: dict[str, torch.Tensor] = {}
        self._steps = 0
        # Told before and after the model is sharded (``before_sharding()``,
        # ``after_sharding({id(old parameter): new parameter})``): e.g. the runner's frozen-base record.
        self.sharding_listeners: list[Any] = []
        self._scratch: dict[int, Any] = {}  # per column: metrics that padding batches update
        self._resident = False  # inside resident(): Lightning's teardown leaves the module on its device

    # -- where the module lives between Lightning calls ----------------------------------
    @contextlib.contextmanager
    def resident(self):
        """Keep the module on its device between ``fit`` and evaluation calls, for a whole run.

        Lightning's ``Strategy.teardown`` ends every ``fit`` and ``validate`` by moving the module
        (and the optimizer state) to host memory, and the next call moves it back: on a GPU, two
        copies of the weights per evaluation pass and of the weights and AdamW moments per stage,
        most of the time between a run's stages (``perf/gpu_report.py``, part ``teardown``).
        Inside this context :meth:`cpu` leaves the module where it is, and it moves to the host
        once, when the context ends, where a run has always left it. On a CPU nothing moves either way.
        """
        self._resident = True
        try:
            yield self
        finally:
            self._resident = False
            self.cpu()

    def cpu(self) -> "ContinualModule":
        if self._resident:
            return self  # Lightning's teardown after a fit or a pass: see resident()
        return super().cpu()

    def forward(self, inputs: Any) -> Any:
        return self.objective.forward(self.model, inputs)

    def configure_model(self) -> None:
        """Shard the model (FSDP2) under Lightning's ``ModelParallelStrategy``; Lightning calls
        this at every ``fit`` and evaluation, the model is sharded at the first of them (after the
        strategy's ``adapt_model`` and any ``--resume`` restore made and filled every parameter)."""
        mesh = self.device_mesh
        if mesh is None:
            return
        from clbench.engine import sharding

        if sharding.is_sharded(self.model):
            sharding.reshard(self.model)
            sharding.check_unchanged(self.model)
            return
        self.adapt_for_sharding()
        for listener in self.sharding_listeners:
            listener.before_sharding()
        moved = sharding.shard_model(self.model, mesh)
        for listener in self.sharding_listeners:
            listener.after_sharding(moved)

    @property
    def experience(self) -> int:
        """Position of the experience being trained (the context's)."""
        return self.context.experience

    @experience.setter
    def experience(self, value: int) -> None:
        self.context.experience = value

    def setup(self, stage: str) -> None:
        """Lightning attached a Trainer (every ``fit`` and evaluation): where training runs."""
        trainer = attached_trainer(self)
        if trainer is not None:
            self.context.device = trainer.strategy.root_device
            self.context.rank, self.context.world_size = trainer.global_rank, trainer.world_size

    def adapt_for_sharding(self) -> None:
        """Let the strategy create every parameter the run will need (none can be added to a
        sharded model), keeping which parameters train as it was: new ones stay frozen until
        the strategy opens them."""
        trainable = {name for name, p in self.model.named_parameters() if p.requires_grad}
        self.strategy.adapt_model(self.context, len(self.strategy.experiences))
        for name, p in self.model.named_parameters():
            p.requires_grad_(name in trainable)

    # -- training -------------------------------------------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
        with auxiliary.collect() as terms:
            loss = self._step(batch, terms)
        self._accumulate(loss, terms)
        trainer = attached_trainer(self)
        if trainer is not None and trainer.loggers:
            # every trainer.log_every_n_steps steps; the value is read (a device sync) only then
            self.log("train/loss_step", loss.detach(), on_step=True, on_epoch=False, batch_size=1)
        return loss if self.automatic_optimization else None

    def _step(self, batch: Any, terms: dict[str, torch.Tensor]) -> torch.Tensor:
        # Only the returned values' types are checked here (cheap); clbench.plugins.hooks words the error.
        if self.strategy.owns_update:
            loss = self.strategy.update(self.context, batch)
            if not isinstance(loss, torch.Tensor):
                raise returned(self.strategy, "update", loss)
            return loss
        pair = self.strategy.prepare_batch(self.context, batch)
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise returned(self.strategy, "prepare_batch", pair)
        inputs, targets = pair
        outputs = self.objective.forward(self.model, inputs)
        loss = self.objective.loss(outputs, targets)
        if terms:  # added by layers during the forward pass
            loss = loss + sum(terms.values())
        loss = self.strategy.training_loss(self.context, inputs, targets, outputs, loss)
        if not isinstance(loss, torch.Tensor):
            raise returned(self.strategy, "training_loss", loss)
        return loss

    def _accumulate(self, loss: torch.Tensor, terms: dict[str, torch.Tensor]) -> None:
        self._loss_sum = self._loss_sum.to(loss.device) + loss.detach()
        for name, value in terms.items():
            self._aux_sums[name] = self._aux_sums.get(name, torch.zeros((), device=loss.device)) + value.detach()
        self._steps += 1

    def on_train_epoch_start(self) -> None:
        self._loss_sum = torch.zeros((), device=self.device)
        self._aux_sums = {}
        self._steps = 0

    def on_train_end(self) -> None:
        # The stage's optimizer is done (every fit builds a fresh one): its state is dropped here,
        # before Lightning's teardown would copy it to host memory.
        trainer = attached_trainer(self)
        for optimizer in trainer.optimizers if trainer is not None else ():
            optimizer.state.clear()

    def on_train_epoch_end(self) -> None:
        if not self._steps:
            return
        mean = (self._loss_sum / self._steps).item()  # one sync per epoch
        if not math.isfinite(mean):
            raise NonFiniteLoss(f"training loss became {mean} in epoch {self.current_epoch} "
                                f"(experience {self.experience})", value=mean)
        if self.loggers:
            values = {f"train/exp{self.experience}/loss": mean, "train/loss": mean}
            values.update({f"train/aux/{name}": (total / self._steps).item() for name, total in self._aux_sums.items()})
            for logger in self.loggers:
                logger.log_metrics(values, step=self.current_epoch)

    def on_after_backward(self) -> None:
        self.strategy.after_backward(self.context)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.strategy.before_optimizer_step(self.context, optimizer)

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        self.strategy.after_optimizer_step(self.context)

    def configure_optimizers(self) -> Any:
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params and self.strategy.owns_update:
            return None  # a closed-form learner may have nothing for an optimizer to do
        optimizer = self.make_optimizer(params)
        if self.make_scheduler is None:
            return optimizer
        from clbench.engine.trainer import stage_steps

        scheduler = self.make_scheduler(optimizer, stage_steps(self.trainer))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def rebuild_optimizer(self) -> None:
        """Build the optimizer (and scheduler) again over the current trainable parameters
        (strategies call it as ``ctx.rebuild_optimizer()``).

        Between experiences nothing is needed: every ``fit`` builds them afresh. A strategy that
        adds or reshapes parameters in the middle of an experience calls this afterwards; the
        old optimizer state is dropped, since it belongs to tensors that no longer exist.
        """
        trainer = attached_trainer(self)
        if trainer is not None and trainer.state.fn == TrainerFn.FITTING:
            trainer.strategy.setup_optimizers(trainer)

    # -- evaluation -----------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self.objective.begin_evaluation()

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        column = self.columns[dataloader_idx]
        padding = isinstance(batch, Padding)
        if padding:  # the same forwards as a real batch; its metrics, outputs (and routing) are dropped
            batch = batch.batch
            if dataloader_idx not in self._scratch:
                self._scratch[dataloader_idx] = self.eval_metrics[dataloader_idx].clone()
            metrics = self._scratch[dataloader_idx]
        else:
            metrics = self.eval_metrics[dataloader_idx]
        evaluate = self.objective.evaluate_padding if padding else self.objective.evaluate
        with self.strategy.evaluating(self.context, column):
            evaluate(self.model, batch, metrics, column)

    def compute_columns(self) -> tuple["ColumnValues", list[list[float | None] | None]]:
        """The pass's values per column (:class:`~clbench.engine.state.ColumnValues`: the
        R entries, their sampling errors, every metric) and each column's per-class recalls; the
        metrics are reset for the next pass. Every process calls it (the states are synced)."""
        from clbench.engine.precision import casts_kept
        from clbench.engine.state import ColumnValues
        from clbench.strategy import Strategy

        # what the objective deferred (pooled generation) is done first, in the strategy's
        # per-column context where it has one, and in the run's precision: Lightning enters it
        # around each step only, and this runs after the pass's last step (bf16-mixed: autocast)
        own_context = type(self.strategy).evaluating is not Strategy.evaluating
        with self.trainer.precision_plugin.forward_context(), casts_kept(self.model):
            self.objective.finish_evaluation(
                self.model, (lambda column: self.strategy.evaluating(self.context, column)) if own_context else None)
        computed, sampling, recalls = [], [], []
        for column, primary in zip(self.eval_metrics, self.primary):
            computed.append({name: float(value) for name, value in column.compute().items()})
            sampling.append(sampling_error(column[primary]))  # the test set's noise in the R cell
            recalls.append(_class_recalls(column))
            column.reset()
        for scratch in self._scratch.values():
            scratch.reset()
        names = list(dict.fromkeys(name for values in computed for name in values))
        return ColumnValues(primary=[values[name] for values, name in zip(computed, self.primary)],
                            stderr=[se for se, _ in sampling], n=[n for _, n in sampling],
                            metrics={name: [values.get(name) for values in computed] for name in names}), recalls

    def on_validation_epoch_end(self) -> None:
        self.objective.end_evaluation()

    def on_validation_end(self) -> None:
        if self.device_mesh is not None:
            from clbench.engine.sharding import reshard

            reshard(self.model)  # evaluation leaves the root unit unsharded


def _class_recalls(column) -> list[float | None] | None:
    """Per-class recall over every process (None for classes the column has no sample of),
    rounded to 4 digits, from the column's first metric that keeps them (``recalls()``: G-mean);
    None when none does. Kept for the final stage so that a G-mean of 0 can be traced to the
    classes never predicted."""
    metric = next((column[name] for name in column.keys() if callable(getattr(column[name], "recalls", None))), None)
    if metric is None:
        return None
    with metric.sync_context(should_unsync=True):
        recalls = metric.recalls().tolist()
    return [None if value != value else round(value, 4) for value in recalls]
