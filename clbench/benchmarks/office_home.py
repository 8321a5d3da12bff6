"""Office-Home (Venkateswara et al., 2017) read from its published on-disk layout.

About 15,500 images of 65 office and home object classes in four domains:
``OfficeHomeDataset_10072016/{Art,Clipart,Product,Real World}/<Class>/*.jpg``. ``root`` is the
``OfficeHomeDataset_10072016`` folder (the one holding the four domain folders) or its parent.

The stream has one experience per domain, in the thesis's order (seeds_004 section 3.3):
Art -> Clipart -> Product -> Real World, named ``art``, ``clipart``, ``product`` and
``real_world``. Office-Home has no official train/test split, so each domain is split by a
seeded, class-stratified split (``test_fraction``, 0.2 by default as in Continuum). Labels
follow the sorted class-folder names (as torchvision's ``ImageFolder`` orders them); when
``classes`` keeps only some classes, labels are renumbered 0..k-1 in that same order.

Many Office-Home photos are several hundred to a few thousand pixels wide, so decoding them
costs more than augmenting them. ``preload: true`` decodes every image once when the stream is
built, already resized to ``image_size`` (about 2.3 GB of memory for the whole dataset at 224
px), and the loader workers then only augment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import AfterValidator, Field

from clbench.benchmarks.image_transforms import Augment, AugmentOverrides, image_transform, resolve_augment
from clbench.benchmarks.images import (ImageArray, ImageFiles, ImageSize, Normalization, TestFraction, dataset_root,
                                       derived_seed, list_images, preload_images, stratified_split)
from clbench.errors import UserError
from clbench.data.streams import StreamSpec, build_scenario
from clbench.config.validation import distinct

FOLDER = "OfficeHomeDataset_10072016"
# experience name -> folder name, in the thesis's order
DOMAINS = {"art": "Art", "clipart": "Clipart", "product": "Product", "real_world": "Real World"}
CLASSES = (
    "Alarm_Clock", "Backpack", "Batteries", "Bed", "Bike", "Bottle", "Bucket", "Calculator", "Calendar", "Candles",
    "Chair", "Clipboards", "Computer", "Couch", "Curtains", "Desk_Lamp", "Drill", "Eraser", "Exit_Sign", "Fan",
    "File_Cabinet", "Flipflops", "Flowers", "Folder", "Fork", "Glasses", "Hammer", "Helmet", "Kettle", "Keyboard",
    "Knives", "Lamp_Shade", "Laptop", "Marker", "Monitor", "Mop", "Mouse", "Mug", "Notebook", "Oven",
    "Pan", "Paper_Clip", "Pen", "Pencil", "Postit_Notes", "Printer", "Push_Pin", "Radio", "Refrigerator", "Ruler",
    "Scissors", "Screwdriver", "Shelf", "Sink", "Sneakers", "Soda", "Speaker", "Spoon", "TV", "Table",
    "Telephone", "ToothBrush", "Toys", "Trash_Can", "Webcam",
)
FIX = "see docs/datasets.md: download OfficeHomeDataset_10072016.zip from the Office-Home page and extract it whole"
DEFAULT_AUGMENT = Augment()


def _missing(kind: str, paths: list[str]) -> UserError:
    """One error naming the first path in full and up to five more by their last two parts."""
    more = f" (and {len(paths) - 1} more: {', '.join('/'.join(Path(p).parts[-2:]) for p in paths[1:6])}" \
           f"{', ...' if len(paths) > 6 else ''})" if len(paths) > 1 else ""
    return UserError(f"{kind}{more}", where=paths[0], fix=FIX)


def locate(root: str) -> Path:
    """The folder holding the four domain folders."""
    base = dataset_root(root, "Office-Home", f"point root at the {FOLDER} folder")
    if (base / FOLDER).is_dir():
        return base / FOLDER
    return base


# Names chosen from the dataset's, each once; the stream keeps the dataset's order.
Domains = Annotated[list[Literal[tuple(DOMAINS)]], Field(min_length=1), AfterValidator(distinct)]
Classes = Annotated[list[Literal[CLASSES]], Field(min_length=1), AfterValidator(distinct)]


def _in_order(values: list[str] | None, allowed) -> list[str]:
    return list(allowed) if values is None else [a for a in allowed if a in values]


def scan(base: Path, domains: list[str], classes: list[str]) -> dict[str, list[tuple[str, int]]]:
    """experience name -> [(path, class position in ``classes``)], every problem of a kind named."""
    missing_domains = [str(base / DOMAINS[d]) for d in domains if not (base / DOMAINS[d]).is_dir()]
    if missing_domains:
        raise _missing("domain folder missing", missing_domains)
    out: dict[str, list[tuple[str, int]]] = {}
    missing, empty = [], []
    for d in domains:
        samples = []
        for k, name in enumerate(classes):
            folder = base / DOMAINS[d] / name
            if not folder.is_dir():
                missing.append(str(folder))
                continue
            files = list_images(folder)
            if not files:
                empty.append(str(folder))
            samples += [(str(folder / f), k) for f in files]
        out[d] = samples
    if missing:
        raise _missing("class folder missing", missing)
    if empty:
        raise _missing("class folder has no images", empty)
    return out


def office_home(root: str, domains: Domains | None = None, classes: Classes | None = None,
                test_fraction: TestFraction = 0.2, split_seed: int = 0, image_size: ImageSize = 224,
                augment: bool | AugmentOverrides = True, normalize: Normalization = "imagenet", preload: bool = False):
    """Office-Home as a domain-incremental stream, one experience per domain.

    ``domains`` keeps some of ``art``, ``clipart``, ``product``, ``real_world`` (the run order
    is set by the config's ``order``); ``classes`` keeps some of the 65 class folders (default:
    all, each required in every domain). ``preload`` decodes all images into memory first.
    """
    aug = resolve_augment(augment, DEFAULT_AUGMENT)
    use_domains = _in_order(domains, tuple(DOMAINS))
    use_classes = _in_order(classes, CLASSES)
    base = locate(root)
    samples = scan(base, use_domains, use_classes)

    train_tf = image_transform(image_size, aug, normalize)
    eval_tf = image_transform(image_size, None, normalize)
    train, test = [], []
    for d in use_domains:
        paths = [p for p, _ in samples[d]]
        y = np.array([k for _, k in samples[d]], dtype=np.int64)
        tr, te = stratified_split(y, test_fraction, derived_seed(split_seed, list(DOMAINS).index(d)),
                                  where=str(base / DOMAINS[d]))
        if preload:
            images = preload_images(paths, image_size)
            train.append(ImageArray(images, tr, y[tr], train_tf, channels_last=True))
            test.append(ImageArray(images, te, y[te], eval_tf, channels_last=True))
        else:
            train.append(ImageFiles([paths[i] for i in tr], y[tr], train_tf, draft_size=image_size))
            test.append(ImageFiles([paths[i] for i in te], y[te], eval_tf, draft_size=image_size))
    spec = StreamSpec(name="office-home", num_classes=len(use_classes), input_shape=(3, image_size, image_size),
                      scenario_type="domain-il", class_names=list(use_classes), imbalance_metrics=True)
    return build_scenario(spec, train, test, names=use_domains,
                          domain_ids=[list(DOMAINS).index(d) for d in use_domains],
                          classes=[list(range(len(use_classes)))] * len(use_domains))


office_home.objective = "classification"  # the stream's objective, known before it is built (preflight)
