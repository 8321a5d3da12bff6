"""Routing records: per-layer expert utilization and N_eff, fed by what MoE layers report.

Layers report through :mod:`clbench.models.routing_channel` (``record``); a
:class:`RoutingRecorder` listens. The evaluation loop says which domain the following forward
passes belong to::

    recorder = RoutingRecorder(num_domains=D).attach(model)
    for d, loader in enumerate(test_loaders):
        with recorder.domain(d), torch.no_grad():
            for x, _ in loader:
                model(x)
    figures = recorder.compute()   # {"blocks.8.mlp": {"utilization": (D, E), ...}, ...}
    recorder.reset()

In a run, :class:`clbench.metrics.routing_recording.RoutingRecording` (a Lightning callback)
does this for every evaluation and every experience's training.

``attach`` names every layer whose class sets ``records_routing = True`` by its qualified
module name and creates its :class:`~clbench.metrics.ExpertUtilization` up front (its expert
count read from ``layer.num_experts``). Creating them up front matters under DDP: every process
then syncs the same metrics in the same order in ``compute``, even one that routed nothing.
A layer may also be named by a string (``record("router0", ...)``); an unattached string name
gets a metric on first use, its expert count from ``num_experts=`` or the gates' last
dimension. Inputs are detached.

With ``keep_routes=True`` the recorder also keeps each unit's route (its expert indices, after
its ``subspace`` id where the layer reports one) and domain on the CPU, for route-wise statistics such as
:func:`clbench.metrics.effective_compositions`; those kept routes are per process. With
``compositions=True`` it counts each unit's (route, composition) pair for the route-wise N_eff
(:meth:`RoutingRecorder.compositions`; compositions are described by the channel's ``units``).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch import Tensor, nn

from clbench.models.protocol import records_routing
from clbench.models.routing_channel import current_units, recording_into

if TYPE_CHECKING:
    from clbench.metrics.compositions import CompositionCounter
    from clbench.metrics.utilization import ExpertUtilization


class RoutingRecorder:
    """Per-layer :class:`ExpertUtilization` metrics fed by :func:`record` calls.

    ``num_domains``: the number of domains (test experiences) the loop will name.
    ``compositions``: also count (route, composition) pairs per layer for N_eff.
    ``metric_kwargs`` are passed to every ``ExpertUtilization`` (e.g. ``process_group``).
    """

    def __init__(self, num_domains: int, *, keep_routes: bool = False, compositions: bool = False,
                 **metric_kwargs: Any):
        if not isinstance(num_domains, int) or num_domains < 1:
            raise ValueError(f"num_domains must be a positive int, got {num_domains!r}")
        self.num_domains = num_domains
        self.keep_routes = keep_routes
        self._metric_kwargs = metric_kwargs
        self.metrics: dict[str, ExpertUtilization] = {}
        self._names: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()
        self._routes: dict[str, list[tuple[Tensor, Tensor]]] = {}
        self.count_compositions = compositions
        self._compositions: dict[str, CompositionCounter] = {}

    # -- set-up ------------------------------------------------------------------------------
    def add_layer(self, name: str, num_experts: int) -> ExpertUtilization:
        """Create (or return) the metric for layer ``name``."""
        # imported here so that MoE layers can import ``record`` without loading torchmetrics
        from clbench.metrics.utilization import ExpertUtilization

        metric = self.metrics.get(name)
        if metric is None:
            metric = ExpertUtilization(self.num_domains, int(num_experts), **self._metric_kwargs)
            self.metrics[name] = metric
        elif metric.num_experts != num_experts:
            raise ValueError(f"layer {name!r} was registered with {metric.num_experts} experts, "
                             f"now reports {num_experts}")
        return metric

    def attach(self, model: nn.Module, prefix: str = "") -> "RoutingRecorder":
        """Register every submodule whose class sets ``records_routing = True`` (a
        :class:`clbench.models.protocol.RoutingLayer`)."""
        found = 0
        for name, module in model.named_modules(prefix=prefix):
            if records_routing(module):
                num_experts = getattr(module, "num_experts", None)
                if not isinstance(num_experts, int):
                    raise ValueError(f"routing layer {name or type(module).__name__!r} must have "
                                     "an int attribute num_experts")
                label = name or type(module).__name__
                self._names[module] = label
                self.add_layer(label, num_experts)
                found += 1
        if not found:
            raise ValueError("no submodule sets records_routing = True; nothing to record")
        return self

    @contextlib.contextmanager
    def domain(self, domain: int) -> Iterator["RoutingRecorder"]:
        """Attribute the routing recorded inside the block to ``domain``."""
        if not 0 <= int(domain) < self.num_domains:
            raise ValueError(f"domain must lie in [0, {self.num_domains}), got {domain}")
        with recording_into(self, domain):
            yield self

    # -- recording ---------------------------------------------------------------------------
    def _name_of(self, layer: nn.Module | str) -> str:
        if isinstance(layer, str):
            return layer
        name = self._names.get(layer)
        if name is None:
            raise ValueError(f"{type(layer).__name__} is not attached to this recorder: call "
                             "recorder.attach(model) or record under a string name")
        return name

    def log(self, layer: nn.Module | str, *, domain: int, experts: Tensor | None = None,
            gates: Tensor | None = None, mask: Tensor | None = None,
            num_experts: int | None = None, subspace: Tensor | None = None) -> None:
        """Add one forward's routing to ``layer``'s metric (what :func:`record` calls).

        Utilization counts experts; a route for N_eff is ``(subspace, *experts)`` where the
        layer reports a ``subspace`` per unit, its experts otherwise."""
        if experts is None and gates is None:
            raise ValueError("record routing with experts=, gates= or both")
        name = self._name_of(layer)
        metric = self.metrics.get(name)
        if metric is None:
            if num_experts is None and gates is not None:
                num_experts = gates.shape[-1]
            if num_experts is None:
                raise ValueError(f"first record of layer {name!r} needs gates= or num_experts=")
            metric = self.add_layer(name, num_experts)
        device = (experts if experts is not None else gates).device
        if metric.device != device:
            metric.to(device)
        chosen = experts if experts is not None else gates.argmax(-1, keepdim=True)
        chosen = chosen.detach().reshape(-1, chosen.shape[-1])
        if subspace is not None:
            subspace = subspace.detach().reshape(-1).to(device=device, dtype=torch.long)
            if subspace.shape[0] != chosen.shape[0]:
                raise ValueError(f"subspace has {subspace.shape[0]} units but experts {chosen.shape[0]}")
        layout = current_units()
        unit_mask, labels = layout.resolve(chosen.shape[0]) if layout is not None else (None, None)
        if unit_mask is not None:
            unit_mask = unit_mask.to(device)
            mask = unit_mask if mask is None else mask.detach().reshape(-1).bool() & unit_mask
        metric.update(experts=experts, gates=gates, domain=domain, mask=mask)
        keep = None if mask is None else mask.detach().reshape(-1).bool().to(device)
        if self.keep_routes:
            route = chosen if subspace is None else torch.cat([subspace[:, None], chosen.long()], 1)
            kept = (route if keep is None else route[keep]).cpu()
            domains = torch.full((kept.shape[0],), domain, dtype=torch.long)
            self._routes.setdefault(name, []).append((domains, kept))
        if self.count_compositions:
            from clbench.metrics.compositions import CompositionCounter

            counter = self._compositions.setdefault(name, CompositionCounter())
            if (0 if labels is None else labels.shape[1]) == (0 if layout is None else layout.label_width):
                counter.update(chosen, domain, labels=None if labels is None else labels.to(device), keep=keep,
                               subspace=subspace)
            else:  # the layout cannot say which labels these units carry: no composition for them
                counter.skip(domain, chosen.shape[0] if keep is None else int(keep.sum()))

    # -- results -----------------------------------------------------------------------------
    def compute(self) -> dict[str, dict[str, Tensor]]:
        """Figures per layer, synced across processes (layers in name order on every rank).

        A layer that routed nothing in this pass (e.g. an adapter not yet trained for any task)
        is still computed, so every process syncs the same metrics; torchmetrics' warning about
        a compute before any update is expected then and kept quiet."""
        import warnings

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*was called before the ``update`` method.*")
            return {name: self.metrics[name].compute() for name in sorted(self.metrics)}

    def routes(self, layer: str) -> tuple[Tensor, Tensor]:
        """``(domains (U,), routes (U, k))`` kept for ``layer`` (needs ``keep_routes=True``); a
        layer that reports a ``subspace`` has it as each route's first column, ``(U, 1 + k)``."""
        if not self.keep_routes:
            raise ValueError("routes are kept only with RoutingRecorder(..., keep_routes=True)")
        kept = self._routes.get(layer, [])
        if not kept:
            return torch.zeros(0, dtype=torch.long), torch.zeros((0, 1), dtype=torch.long)
        return torch.cat([d for d, _ in kept]), torch.cat([e for _, e in kept])

    def compositions(self, domains: Any = None) -> dict[str, dict[str, float]]:
        """Route-wise N_eff per layer over the units of ``domains`` (all when None); needs
        ``compositions=True``. Layers with no such unit are left out. Under data parallelism
        every process must call it: the counts of all processes are merged first (one
        ``all_gather_object``), so the figures equal one process's over the whole test set."""
        from clbench.metrics.compositions import CompositionCounter

        if not self.count_compositions:
            raise ValueError("compositions are counted only with RoutingRecorder(..., compositions=True)")
        counters = self._compositions
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            shards: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(shards, {name: (c.pairs, c.width, c.unlabelled) for name, c in counters.items()})
            counters = {}
            for shard in shards:
                for name, (pairs, width, unlabelled) in shard.items():
                    counters.setdefault(name, CompositionCounter()).merge(pairs, width, unlabelled)
        out = {}
        for name in sorted(counters):
            figures = counters[name].summary(domains)
            if figures is not None:
                out[name] = figures
        return out

    def reset(self) -> None:
        """Clear the accumulated routing (layers stay registered)."""
        for metric in self.metrics.values():
            metric.reset()
        self._routes.clear()
        self._compositions.clear()

    def to(self, device: torch.device | str) -> "RoutingRecorder":
        for metric in self.metrics.values():
            metric.to(device)
        return self
