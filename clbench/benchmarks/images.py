"""Image datasets, shared by the on-disk vision streams: decoding, checking and preloading images.

Two per-sample datasets feed every image stream:

* :class:`ImageFiles` decodes one file per sample with PIL (CORe50 PNGs, Office-Home JPEGs).
* :class:`ImageArray` indexes a uint8 array already in memory or memory-mapped (CIFAR-10's
  pickled batches, CORe50's ``core50_imgs.npz``, Office-Home decoded once by
  :func:`preload_images`), so nothing is decoded while training.

Both are per-sample on purpose: the training augmentations are random *per image*, and
torchvision's v2 transforms draw one set of parameters per call, so a batch-level call would
crop, flip and jitter a whole batch identically. Deterministic evaluation transforms do not
have that problem, so in-memory test splits use :class:`clbench.data.datasets.ArrayDataset` with a
batch-aware transform (one call per batch, no per-sample overhead).

The transforms applied to each image are :mod:`clbench.benchmarks.image_transforms`'s; the
table below measures decoding and transforming together, since the worker count needs both.

Decoding cost and worker count. CPU time per image on one core of an x86 VM (Pillow 13,
torchvision 0.29), training pipeline at ``image_size=224`` unless noted:

==========================================  =========  ===================
input                                       ms/image   images/s per worker
==========================================  =========  ===================
CORe50 PNG (128 px; decode alone 0.4 ms)    1.8        ~550
CORe50 from ``core50_imgs.npz``             1.2        ~850
Office-Home JPEG, 800x600 (draft decode)    4.0        ~250
Office-Home preloaded (``preload: true``)   1.4        ~700
CIFAR-10 at 32 px, thesis augmentations     0.35       ~2800
==========================================  =========  ===================

Evaluation (resize only) costs about 1.1 ms per CORe50 PNG. Hue jitter adds about 1.5 ms per
image, which is why ``hue`` defaults to 0 and why colour jitter runs at the smaller of the
native and target resolutions. A ViT-small/16 training step in bf16 on an H100-class GPU
consumes a few thousand 224 px images per second (an estimate: no GPU was at hand for these
measurements), so ``train.num_workers`` should be about that rate divided by the last column:
8 workers for CORe50 (the experiment configs set 8), 5-6 from the npz or for preloaded
Office-Home, while Office-Home decoded from its JPEGs would need every core of a 16-core
machine, hence ``preload``. Measure the real rate with
``clbench data check BENCHMARK --root DIR --speed 50 --workers N``. Loader workers are
separate processes, so the datasets stay light to copy: paths and labels are numpy arrays (no
per-item Python objects whose reference counts would un-share forked memory), and a
memory-mapped npz is reopened in each worker rather than pickled.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Callable, Literal, Sequence

import numpy as np
import torch
from pydantic import Field
from torch.utils.data import Dataset

from clbench.benchmarks.npz_array import NpzArray
from clbench.errors import UserError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp", ".tif", ".tiff")


# -- errors ---------------------------------------------------------------------------------------

class ImageDecodeError(UserError):
    """An image file that PIL cannot decode, reported as one line naming the file.

    A DataLoader worker's exception reaches the main process re-raised by torch as
    ``type(err)(text)``, where ``text`` is the worker's whole formatted traceback. This class
    recovers the original one-line message from that text (its last line), so a corrupt file
    met during training still prints as one line.
    """

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None):
        if where is None and fix is None and "Traceback (most recent call last)" in what:
            last = [line for line in what.strip().splitlines() if line.strip()][-1]
            what = last.split(": ", 1)[1] if ": " in last else last
        super().__init__(what, where=where, fix=fix)


def decode_error(path: str, err: BaseException) -> ImageDecodeError:
    reason = str(err).splitlines()[0] if str(err) else ""
    reason = reason.replace(f"'{path}'", "").replace(path, "").strip(" :") or type(err).__name__
    return ImageDecodeError(f"cannot decode image ({reason})", where=path,
                            fix="re-extract the dataset archive or delete the corrupt file")


# -- files on disk --------------------------------------------------------------------------------

def is_image_file(name: str) -> bool:
    return not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS)


def list_images(folder: Path) -> list[str]:
    """Image file names in ``folder`` (hidden files and non-images skipped), sorted."""
    with os.scandir(folder) as entries:
        return sorted(e.name for e in entries if e.is_file() and is_image_file(e.name))


def open_rgb(path: str, draft_size: int | None = None):
    """The image at ``path`` as an RGB PIL image, fully decoded.

    ``draft_size`` lets PIL's JPEG decoder scale down by 1/2, 1/4 or 1/8 during decoding while
    keeping both sides at least that large: a 2000 px photo decoded for a 224 px model costs a
    fraction of a full decode. It has no effect on other formats.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:  # reads the header only
            _check_pixels(path, image.size, Image.MAX_IMAGE_PIXELS)
            if draft_size is not None:
                image.draft("RGB", (draft_size, draft_size))
            return image.convert("RGB")
    except Image.DecompressionBombError as err:  # over twice the limit: PIL refuses to open it
        raise _too_large(path, str(err).split(",")[0]) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise decode_error(path, err) from None


def _check_pixels(path: str, size: tuple[int, int], limit: int | None) -> None:
    """Refuse, before decoding, an image larger than Pillow's decompression-bomb limit (where
    Pillow only warns): a dataset image of hundreds of megapixels is damaged or hostile, and
    decoding it could take the machine's memory."""
    width, height = size
    if limit is not None and width * height > limit:
        raise _too_large(path, f"{width}x{height} = {width * height:,} pixels, over Pillow's limit of {limit:,}")


def _too_large(path: str, reason: str) -> ImageDecodeError:
    return ImageDecodeError(f"image too large to decode safely ({reason})", where=path,
                            fix="a dataset image this large is damaged or not the dataset's: re-extract the "
                                "archive or delete the file")


def verify_images(paths: Sequence[str], workers: int = 8) -> list[tuple[str, str]]:
    """(path, reason) for every file that does not decode; decodes all of them with threads
    (Pillow releases the GIL while decoding)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(path: str) -> tuple[str, str] | None:
        try:
            open_rgb(path)
        except ImageDecodeError as err:
            return path, err.what
        return None

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return [bad for bad in pool.map(one, paths, chunksize=64) if bad is not None]


def preload_images(paths: Sequence[str], size: int, threads: int | None = None) -> np.ndarray:
    """Every file decoded once and resized to ``size`` x ``size``, as one uint8 array (N, size, size, 3).

    The pipeline's first step resizes every image to that square anyway (and skips the resize
    when it is already that size), so training on the preloaded array sees the same images
    (up to PIL's versus torchvision's bilinear resampling) while the loader workers only
    augment. Decoding runs in threads; Pillow releases the GIL while it decodes and resizes.
    """
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    out = np.empty((len(paths), size, size, 3), dtype=np.uint8)

    def one(i: int) -> None:
        image = open_rgb(str(paths[i]), size)
        out[i] = np.asarray(image.resize((size, size), Image.BILINEAR))

    with ThreadPoolExecutor(max_workers=threads or min(16, os.cpu_count() or 1)) as pool:
        list(pool.map(one, range(len(paths)), chunksize=32))
    return out


class ImageFiles(Dataset):
    """One image file per sample: ``(transform(image), label)``.

    ``paths`` and ``targets`` are held as numpy arrays: a loader's worker processes share them
    with the parent without touching per-item reference counts.
    """

    def __init__(self, paths: Sequence[str], targets: Sequence[int], transform: Callable | None = None,
                 draft_size: int | None = None):
        if len(paths) != len(targets):
            raise ValueError(f"{len(paths)} paths but {len(targets)} targets")
        self.paths = np.asarray([str(p) for p in paths], dtype=np.str_)
        self.targets = np.asarray(targets, dtype=np.int64)
        self.transform = transform
        self.draft_size = draft_size

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        image = open_rgb(str(self.paths[index]), self.draft_size)
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.targets[index])


# -- arrays in memory or memory-mapped ------------------------------------------------------------

class ImageArray(Dataset):
    """Samples ``indices`` of a uint8 image array: ``(transform(image), label)``.

    ``source`` is an array of shape (N, H, W, 3) (``channels_last``) or (N, 3, H, W), or an
    :class:`NpzArray`. Indices select rows without copying, so several experiences share one
    memory-mapped file.
    """

    def __init__(self, source: np.ndarray | NpzArray, indices: Sequence[int], targets: Sequence[int],
                 transform: Callable | None = None, *, channels_last: bool):
        if len(indices) != len(targets):
            raise ValueError(f"{len(indices)} indices but {len(targets)} targets")
        self.source = source
        self.indices = np.asarray(indices, dtype=np.int64)
        self.targets = np.asarray(targets, dtype=np.int64)
        self.transform = transform
        self.channels_last = channels_last

    def __len__(self) -> int:
        return len(self.targets)

    def image(self, index: int) -> torch.Tensor:
        array = self.source.array if isinstance(self.source, NpzArray) else self.source
        x = torch.from_numpy(np.array(array[self.indices[index]]))  # copy: memmaps are read-only
        return x.permute(2, 0, 1) if self.channels_last else x

    def __getitem__(self, index: int):
        x = self.image(index)
        if self.transform is not None:
            x = self.transform(x)
        return x, int(self.targets[index])


# -- arguments ----------------------------------------------------------------------------------

# The arguments every image stream declares the same way (checked from the config).
ImageSize = Annotated[int, Field(ge=1)]  # the side in pixels: 224 for a ViT/16, 32 for CIFAR-sized models
TestFraction = Annotated[float, Field(gt=0, lt=1)]
Normalization = Literal["imagenet", "inception", "none"]


# -- splits ---------------------------------------------------------------------------------------

def stratified_split(labels: np.ndarray, test_fraction: TestFraction, seed: int, *, where: str
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(train positions, test positions) of a seeded class-stratified split (scikit-learn)."""
    from sklearn.model_selection import train_test_split

    positions = np.arange(len(labels))
    try:
        train, test = train_test_split(positions, test_size=test_fraction, stratify=labels, random_state=seed)
    except ValueError as err:
        raise UserError(f"cannot split {len(labels)} images of {len(np.unique(labels))} classes into train/test "
                        f"with test_fraction={test_fraction} ({err})", where=where,
                        fix="every class needs at least 2 images, and both splits at least one image per class; "
                            "change test_fraction or check the folder") from None
    return np.sort(train), np.sort(test)


def derived_seed(*parts: int) -> int:
    """A 32-bit seed derived from integers (for one seeded split per domain). Dataset splits
    keep their own derivation so that a split never changes when run-level seeding does."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def dataset_root(root: str, dataset: str, fix: str) -> Path:
    """``root`` as a Path, or a one-line error naming it when it is missing or not a folder."""
    base = Path(root).expanduser()
    if not base.exists():
        raise UserError(f"{dataset} root does not exist", where=str(base), fix=f"{fix} (see docs/datasets.md)")
    if not base.is_dir():
        raise UserError(f"{dataset} root is not a folder", where=str(base), fix=fix)
    return base
