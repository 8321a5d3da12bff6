"""What a model (and a layer inside it) may implement for the engine to use.

A model is any ``nn.Module``; these optional members are looked up by name, so a model offers
only what it has. The engine reads them through the helpers below (one place for each), and
:class:`ContinualModel` and :class:`RoutingLayer` document them for type checkers and readers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import nn


@runtime_checkable
class ContinualModel(Protocol):
    """Optional members of a model, each used only where present.

    - ``begin_experience(experience)``: called before each experience trains (after the
      strategy's ``before_experience``), and before a reference model or the pretraining trains
      on an experience's data: per-experience set-up the model owns, such as routing prototypes
      computed from the experience's data (:mod:`clbench.models.vision.prototype`). ``experience``
      is a :class:`clbench.Experience`.
    - ``hf``: the wrapped transformers model of a language model; adapters go into it and
      sharding takes it as the root unit (its ``_no_split_modules`` name the blocks to shard).
    - ``tokenizer``: a language model's tokenizer (the causal-LM objective requires it).
    """

    def begin_experience(self, experience: Any) -> None: ...


@runtime_checkable
class RoutingLayer(Protocol):
    """A mixture-of-experts layer whose routing it reports through :mod:`clbench.models.routing_channel`.

    Its class sets ``records_routing = True`` (the recorder attaches to every such submodule) and
    it has an int ``num_experts``; in its forward it reports each unit's choice with
    ``clbench.models.routing_channel.record(self, experts=..., gates=...)``.
    """

    records_routing: bool
    num_experts: int


def begin_experience(model: "nn.Module", experience: Any) -> None:
    """Call the model's ``begin_experience`` (see :class:`ContinualModel`), if it has one."""
    begin = getattr(model, "begin_experience", None)
    if callable(begin):
        begin(experience)


def records_routing(module: Any) -> bool:
    """Whether ``module`` is a :class:`RoutingLayer`."""
    return bool(getattr(module, "records_routing", False))


def has_routing_layers(model: "nn.Module") -> bool:
    """Whether any submodule of ``model`` records its routing."""
    return any(records_routing(m) for m in model.modules())


def inner_model(model: "nn.Module") -> "nn.Module":
    """The transformers model of a language model (``model.hf``), else ``model`` itself."""
    return getattr(model, "hf", model)
