"""Per-domain expert utilization of one MoE layer, as a DDP-safe torchmetrics ``Metric``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from clbench.metrics.functional import expert_utilization_compute, routing_update


class ExpertUtilization(Metric):
    """``U[d, e]``: the share of domain d's routing units sent to expert e (thesis A.9), with
    the figures that tell expert collapse from domain specialization.

    ``update(experts=None, gates=None, domain=0, mask=None)``: ``experts`` are top-k indices
    ``(..., k)`` (k = 1 included), ``gates`` router probabilities ``(..., E)``; a routing unit
    is whatever the layer routes (token, patch or image) and adds 1/k to each chosen expert,
    so rows sum to 1 for top-k routers too. See :func:`clbench.metrics.functional.routing_update`.

    ``compute()`` returns a dict of tensors (see
    :func:`~clbench.metrics.functional.expert_utilization_compute`): ``utilization`` (D, E),
    ``soft_utilization`` (D, E, mean gate probability), ``domain_entropy`` (D,),
    ``gate_entropy`` (D,), ``load_imbalance`` (scalar coefficient of variation of the pooled
    expert load), ``domain_load_imbalance`` (D,), ``mutual_information`` (I(D; E) in nats) and
    ``units`` (D,). Domains with no recorded unit have NaN rows. As for every torchmetrics
    result, one-element tensors come back squeezed (with one domain the (D,) vectors are 0-dim).

    All states are float64 sums, so the synced result equals the single-process one.
    Most users do not call ``update`` directly: a :class:`clbench.metrics.routing.RoutingRecorder`
    keeps one of these per MoE layer and feeds it from the layers' ``record`` calls.
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    counts: Tensor
    units: Tensor
    gate_mass: Tensor
    gate_entropy: Tensor
    gate_units: Tensor

    def __init__(self, num_domains: int, num_experts: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for name, value in (("num_domains", num_domains), ("num_experts", num_experts)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.num_domains = num_domains
        self.num_experts = num_experts
        matrix = torch.zeros((num_domains, num_experts), dtype=torch.float64)
        vector = torch.zeros(num_domains, dtype=torch.float64)
        self.add_state("counts", default=matrix.clone(), dist_reduce_fx="sum")
        self.add_state("units", default=vector.clone(), dist_reduce_fx="sum")
        self.add_state("gate_mass", default=matrix.clone(), dist_reduce_fx="sum")
        self.add_state("gate_entropy", default=vector.clone(), dist_reduce_fx="sum")
        self.add_state("gate_units", default=vector.clone(), dist_reduce_fx="sum")

    def update(self, experts: Tensor | None = None, gates: Tensor | None = None,
               domain: int | Tensor = 0, mask: Tensor | None = None) -> None:
        stats = routing_update(self.num_domains, self.num_experts, experts=experts, gates=gates,
                               domain=domain, mask=mask)
        for name, value in stats.items():
            state = getattr(self, name)
            state += value.to(state.device)

    def compute(self) -> dict[str, Tensor]:
        return expert_utilization_compute(self.counts, self.units, self.gate_mass,
                                          self.gate_entropy, self.gate_units)
