"""The LightningModule that wraps a model and one strategy plugin.

Lightning owns the loop; this module maps Lightning's hooks onto the strategy's and keeps the
evaluation state. Evaluation is Lightning validation with one dataloader per test experience:
``dataloader_idx`` is the R-matrix column, and each column accumulates into its own
torchmetrics collection, so scores are exact under DDP (states are summed/gathered across
ranks, never averaged per rank).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn

from clbench.errors import NonFiniteLoss
from clbench.strategy import Strategy


def default_eval_metrics(num_classes: int):
    from torchmetrics import MetricCollection
    from torchmetrics.classification import MulticlassAccuracy

    return MetricCollection({"acc": MulticlassAccuracy(num_classes, average="micro")})


class ContinualModule(pl.LightningModule):
    """``model`` + ``strategy`` + the optimizer spec; evaluates ``num_columns`` test sets."""

    def __init__(self, model: nn.Module, strategy: Strategy, *, num_classes: int, num_columns: int,
                 optimizer: Callable[[Any], torch.optim.Optimizer],
                 eval_metrics: Callable[[int], Any] = default_eval_metrics,
                 column_domains: list[int | None] | None = None):
        super().__init__()
        self.model = model
        self.strategy = strategy
        self.num_classes = num_classes
        self.make_optimizer = optimizer
        self.eval_metrics = nn.ModuleList([eval_metrics(num_classes) for _ in range(num_columns)])
        self.experience = 0          # position of the experience being trained
        self.last_eval: dict[str, list[float]] = {}
        # Per-domain expert utilization, when the model has MoE layers that record their routing
        # (clbench.metrics.routing). column_domains[j] is test column j's domain id (None: skip).
        self.column_domains = column_domains
        self.routing = None
        self.last_routing: dict[str, dict[str, Any]] = {}
        if column_domains and any(getattr(m, "records_routing", False) for m in model.modules()):
            from clbench.metrics.routing import RoutingRecorder

            domains = [d for d in column_domains if d is not None]
            self.routing = RoutingRecorder(num_domains=max(domains) + 1).attach(model)
        self.epoch_evals: list[dict[str, list[float]]] = []  # per-epoch evaluation during fit
        self._loss_sum = torch.zeros(())
        self._steps = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    # -- training -------------------------------------------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = self.strategy.prepare_batch(self, batch)
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        loss = self.strategy.training_loss(self, x, y, logits, loss)
        self._loss_sum = self._loss_sum.to(loss.device) + loss.detach()
        self._steps += 1
        return loss

    def on_train_epoch_start(self) -> None:
        self._loss_sum = torch.zeros((), device=self.device)
        self._steps = 0

    def on_train_epoch_end(self) -> None:
        if not self._steps:
            return
        mean = (self._loss_sum / self._steps).item()  # one sync per epoch
        if not math.isfinite(mean):
            raise NonFiniteLoss(f"training loss became {mean} in epoch {self.current_epoch} "
                                f"(experience {self.experience})", value=mean)
        if self.logger is not None:
            self.logger.log_metrics({f"train/loss/exp{self.experience}": mean, "train/loss": mean},
                                    step=self.current_epoch)

    def on_after_backward(self) -> None:
        self.strategy.on_after_backward(self)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.strategy.on_before_optimizer_step(self, optimizer)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.make_optimizer([p for p in self.model.parameters() if p.requires_grad])

    # -- evaluation -----------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        if self.routing is not None:
            self.routing.to(self.device)

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, y = batch[0], batch[1]
        domain = self.column_domains[dataloader_idx] if self.routing is not None else None
        if domain is None:
            logits = self.model(x)
        else:
            with self.routing.domain(domain):
                logits = self.model(x)
        self.eval_metrics[dataloader_idx].update(logits, y)

    def on_validation_epoch_end(self) -> None:
        results: dict[str, list[float]] = {}
        for column in self.eval_metrics:
            for name, value in column.compute().items():
                results.setdefault(name, []).append(float(value))
            column.reset()
        self.last_eval = results
        if self.routing is not None:
            self.last_routing = {layer: {k: v.tolist() for k, v in figures.items()}
                                 for layer, figures in self.routing.compute().items()}
            self.routing.reset()
        if self.trainer.state.fn == TrainerFn.FITTING:
            self.epoch_evals.append(results)
