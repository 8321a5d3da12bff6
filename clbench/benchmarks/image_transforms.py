"""The thesis's image pipeline: training augmentations and the evaluation transform.

The pipeline (:func:`image_transform`) follows the thesis (seeds_004 section 3.7): "resized all
images to the same size, used random resized crops, random flips over the vertical axis, and
low levels of color jitter", plus Gaussian blur and noise for some CIFAR-10 runs. The thesis
states none of the strengths; the defaults of :class:`Augment` are this harness's choices.
What each step costs per image, and so how many loader workers a stream needs, is measured in
:mod:`clbench.benchmarks.images`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Any, Callable

import torch
from pydantic import Field
from typing_extensions import TypedDict

from clbench.benchmarks.images import Normalization
from clbench.config.validation import ArgumentError, mapping_argument


@dataclass(frozen=True)
class Augment:
    """Training augmentations; each can be switched off (``None``, ``False`` or 0).

    ``crop_scale``: area range of ``RandomResizedCrop`` (after resizing to the target size);
    ``flip``: horizontal flip with p=0.5; ``color_jitter``: brightness, contrast and saturation
    factors drawn from [1 - s, 1 + s]; ``hue``: hue shift range (costly, see the module
    docstring); ``blur``: probability of a 3x3 Gaussian blur with sigma in [0.1, 1.0];
    ``noise``: standard deviation of additive Gaussian noise on the [0, 1] pixel scale.
    """

    crop_scale: tuple[float, float] | None = (0.7, 1.0)
    flip: bool = True
    color_jitter: float = 0.2
    hue: float = 0.0
    blur: float = 0.0
    noise: float = 0.0


@mapping_argument
class AugmentOverrides(TypedDict, total=False):
    """``augment: {...}`` in a config: some of :class:`Augment`'s fields (a test keeps the keys
    equal), with their ranges; another key is refused."""

    crop_scale: Annotated[list[Annotated[float, Field(gt=0, le=1)]], Field(min_length=2, max_length=2)] | None
    flip: bool
    color_jitter: Annotated[float, Field(ge=0, le=1)]
    hue: Annotated[float, Field(ge=0, le=0.5)]
    blur: Annotated[float, Field(ge=0, le=1)]
    noise: Annotated[float, Field(ge=0, le=1)]

def resolve_augment(augment: bool | AugmentOverrides, defaults: Augment) -> Augment | None:
    """``augment`` from a config: ``true`` (the stream's defaults), ``false`` (none) or a mapping
    that overrides some of the defaults."""
    if augment is False:
        return None
    if augment is True:
        return defaults
    out = replace(defaults, **augment)
    if out.crop_scale is not None:
        low, high = out.crop_scale
        if low > high:
            raise ArgumentError("benchmark", "augment.crop_scale", f"crop_scale must be [low, high] with low <= high, "
                                f"got {list(out.crop_scale)!r}", fix="e.g. crop_scale: [0.7, 1.0], or null for no crop")
        out = replace(out, crop_scale=(float(low), float(high)))
    return out


def normalization(name: Normalization) -> tuple[tuple, tuple] | None:
    """(mean, std) for ``name``: ``imagenet`` (timm's default), ``inception`` (0.5/0.5, used by
    timm's augreg ViT weights) or ``none``."""
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, IMAGENET_INCEPTION_MEAN, IMAGENET_INCEPTION_STD

    table = {"imagenet": (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
             "inception": (IMAGENET_INCEPTION_MEAN, IMAGENET_INCEPTION_STD), "none": None}
    return table[name]


def image_transform(image_size: int, augment: Augment | None, normalize: str = "imagenet", *,
                    jitter_first: bool = False) -> Callable:
    """The v2 pipeline from a decoded image (PIL or uint8 tensor) to a normalized float tensor.

    Order: resize to ``image_size`` x ``image_size`` (the thesis resizes every image to one
    size; non-square images are squashed, never cropped, so evaluation sees the whole object),
    then the random resized crop, flip and colour jitter, conversion to float, blur, noise and
    normalization. ``jitter_first`` moves the colour jitter before the resize, for streams whose
    images are smaller than the target (CORe50's 128 px, CIFAR's 32 px): the jitter costs the
    same per pixel, so it runs where there are fewer pixels. Without ``augment`` this is the
    evaluation pipeline.
    """
    import torchvision.transforms.v2 as v2

    stats = normalization(normalize)
    jitter = []
    if augment is not None and (augment.color_jitter or augment.hue):
        s = augment.color_jitter
        jitter = [v2.ColorJitter(brightness=s, contrast=s, saturation=s, hue=augment.hue)]
    steps: list[Any] = [v2.ToImage()]
    if jitter_first:
        steps += jitter
    steps.append(v2.Resize((image_size, image_size), antialias=True))
    if augment is not None:
        if augment.crop_scale is not None:
            steps.append(v2.RandomResizedCrop(image_size, scale=augment.crop_scale, antialias=True))
        if augment.flip:
            steps.append(v2.RandomHorizontalFlip())
        if not jitter_first:
            steps += jitter
    steps.append(v2.ToDtype(torch.float32, scale=True))
    if augment is not None and augment.blur:
        steps.append(v2.RandomApply([v2.GaussianBlur(3, sigma=(0.1, 1.0))], p=augment.blur))
    if augment is not None and augment.noise:
        steps.append(v2.GaussianNoise(sigma=augment.noise, clip=True))
    if stats is not None:
        steps.append(v2.Normalize(list(stats[0]), list(stats[1])))
    steps.append(v2.ToPureTensor())
    return v2.Compose(steps)


def batch_transform(image_size: int, normalize: str = "imagenet") -> Callable:
    """The evaluation pipeline for a uint8 batch (B, 3, H, W): one call per batch, no randomness."""
    import torchvision.transforms.v2 as v2

    stats = normalization(normalize)
    steps: list[Any] = [v2.Resize((image_size, image_size), antialias=True), v2.ToDtype(torch.float32, scale=True)]
    if stats is not None:
        steps.append(v2.Normalize(list(stats[0]), list(stats[1])))
    return v2.Compose(steps)
