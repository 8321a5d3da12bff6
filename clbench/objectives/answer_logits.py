"""Training logits over the answer window only: the causal-LM objective's ``answer_logits_only``.

The loss reads the logits of the positions that predict an answer token; the LM head computes
them at every position, prompts included. With ``logits_to_keep`` (transformers) the head runs
over the answer window only (:func:`~clbench.objectives.text_batches.answer_window`: the
positions that predict an answer token in some row of the batch), with the same loss and
gradients: a fifth of a small model's training FLOPs when answers are short.

``true`` always, ``false`` never; by default (``null``) where the model's LM head takes no
gradient (LoRA, O-LoRA, adapter mixtures, MoSEs, Grow after its growth, EWC or GEM on an
adapter), because there it changes no number: the window only drops rows from the head's two
products (h·Wᵀ forward, ∂logits·W backward), each row's result is a dot product whose order does
not depend on how many rows there are, and the dropped rows' gradient is exactly zero (their
labels are ``-100``); the tests check the gradients bit for bit, in fp32 and under bf16
autocast. A trained head's weight gradient ∂W = ∂logitsᵀ·h sums over the positions, and fewer of
them change that sum's order and the last bits of every later number, so the default leaves the
window off there. (A BLAS that splits a product's inner dimension by its row count, as
multi-threaded or GPU kernels may, would round differently; ``false`` is the whole-sequence path
everywhere.)

The decision is made per forward, on the model that runs (Grow's probe trains a copy of a model
whose head is frozen, with its head training), and the window per batch from the labels the
batch carries (:data:`WINDOW`): they travel with the rows, so a strategy that cuts a batch into
samples (EWC's Fisher) gets each sample's own window.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from clbench.objectives.text_batches import answer_window

#: The key under which a training batch's inputs carry their labels; never passed to the model.
WINDOW = "answer_labels"


def head_frozen(model: Any) -> bool:
    """Whether the LM head of ``model`` (a transformers model, or a wrapper with ``.hf``) has
    weights and none of them takes a gradient."""
    hf = getattr(model, "hf", model)
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    return head is not None and not any(p.requires_grad for p in head.parameters())


def carrying(inputs: dict, labels: Tensor, setting: bool | None, keeps_logits: bool) -> dict:
    """``inputs`` with their ``labels`` under :data:`WINDOW` where the window may apply
    (``setting`` is not ``false`` and the model takes ``logits_to_keep``)."""
    if setting is False or not keeps_logits:
        return inputs
    return {**inputs, WINDOW: labels}


def model_inputs(inputs: dict, setting: bool | None, model: Any) -> dict:
    """What ``model`` is called with: :data:`WINDOW` removed and, where ``setting`` (or, unset,
    :func:`head_frozen`) says so, ``logits_to_keep`` set to the carried labels' answer window."""
    labels = inputs.get(WINDOW)
    if labels is None:
        return inputs
    inputs = {key: value for key, value in inputs.items() if key != WINDOW}
    if head_frozen(model) if setting is None else setting:
        start, end = answer_window(labels)
        inputs["logits_to_keep"] = torch.arange(start, end, device=labels.device)
    return inputs
