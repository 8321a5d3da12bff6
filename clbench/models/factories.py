"""Model factories for the embedded and image streams.

Every factory takes ``num_classes`` and ``input_shape`` (given by the stream) followed by its
own keyword arguments (given by the config's ``model.init_args``, their ranges declared in the
signature and checked by :mod:`clbench.config.validation`) and returns a plain ``nn.Module`` mapping a
batch of inputs to class logits.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field
from torch import nn

Positive = Annotated[int, Field(ge=1)]


def mlp(num_classes: int, input_shape: tuple[int, ...], hidden: Positive = 256, depth: Annotated[int, Field(ge=0)] = 2,
        dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0) -> nn.Module:
    """A ReLU multilayer perceptron on the flattened input (``depth: 0`` is a linear classifier)."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def cnn(num_classes: int, input_shape: tuple[int, ...], channels: Positive = 32, hidden: Positive = 128) -> nn.Module:
    """Two 3x3 conv blocks (the second one pooled) and a linear head; sized for small images."""
    in_ch, h, w = input_shape
    return nn.Sequential(
        nn.Conv2d(in_ch, channels, 3, padding=1), nn.ReLU(),
        nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * channels * (h // 2) * (w // 2), hidden), nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )


def vit(num_classes: int, input_shape: tuple[int, ...], name: str | None = None, patch_size: Positive = 2,
        embed_dim: Positive = 64, depth: Positive = 4, num_heads: Positive = 4,
        mlp_ratio: Annotated[float, Field(gt=0)] = 2.0,
        pretrained: bool = False, checkpoint_path: str = "") -> nn.Module:
    """A timm Vision Transformer.

    With ``name`` unset, a small ViT is built directly for ``input_shape`` (an 8x8 digit with
    ``patch_size=2`` gives 16 tokens). With ``name`` (a timm model name such as
    ``vit_small_patch16_224``), that architecture is built for the stream's image size and
    class count; ``checkpoint_path`` loads local weights (nothing is downloaded).
    """
    import timm
    from timm.models.vision_transformer import VisionTransformer

    in_ch, h, w = input_shape
    if name is None:
        return VisionTransformer(img_size=(h, w), patch_size=patch_size, in_chans=in_ch, num_classes=num_classes,
                                 embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio)
    return timm.create_model(name, pretrained=pretrained, num_classes=num_classes, in_chans=in_ch,
                             img_size=(h, w), checkpoint_path=checkpoint_path)
