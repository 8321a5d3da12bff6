"""What ``clbench data check BENCHMARK --root DIR`` checks: is a dataset on disk what the stream expects?

``--root`` may be left out for a benchmark whose ``root`` has a default (Fashion-MNIST's
streams look in the Debian package's folder, then the cache).

The check builds the stream exactly as a run would (so the layout and count checks are the
builder's own, and a check that passes means the run's data loading will too), then decodes
every image file once to find corrupt ones, and prints one row per experience: its classes and
its train/test sample counts. Anything missing or unreadable is a one-line
:class:`~clbench.errors.UserError` that names the path.

``--speed N`` also times N training batches through a real loader with ``--workers``
processes, which is how to choose ``train.num_workers`` for a model on a given machine (see
:mod:`clbench.benchmarks.images` for the per-image costs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from clbench.errors import UserError

#: How errors name the command (its options are in :mod:`clbench.cli.data`).
PROG = "clbench data check"



@dataclass
class ExperienceSummary:
    name: str
    domain_id: int
    classes: list[int]
    train: int
    test: int
    train_class_counts: dict[int, int] = field(default_factory=dict)


@dataclass
class Summary:
    benchmark: str
    root: str
    stream: str
    scenario_type: str
    num_classes: int
    input_shape: list[int]
    experiences: list[ExperienceSummary]
    named_orders: list[str]
    global_test: int | None
    shared_test: bool = False
    images_checked: int | None = None  # image files decoded; None: not checked
    class_names: list[str] | None = None
    speed: dict[str, float] | None = None
    objective: str = "classification"

    @property
    def train_total(self) -> int:
        return sum(e.train for e in self.experiences)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def image_paths(dataset) -> list[str]:
    """Every image file a dataset reads (empty for in-memory datasets)."""
    from torch.utils.data import ConcatDataset, Subset

    from clbench.benchmarks.images import ImageFiles

    if isinstance(dataset, ImageFiles):
        return [str(p) for p in dataset.paths]
    if isinstance(dataset, Subset):
        inner = image_paths(dataset.dataset)
        return [inner[i] for i in dataset.indices] if inner else []
    if isinstance(dataset, ConcatDataset):
        return [p for d in dataset.datasets for p in image_paths(d)]
    return []


def _builder(benchmark: str, root: str | None, init_args: dict):
    import inspect

    from clbench import registry
    from clbench.config.init_args import check_init_args

    target = registry.resolve("benchmarks", benchmark, where=f"{PROG}: BENCHMARK")
    parameter = inspect.signature(target).parameters.get("root")
    if parameter is None:
        raise UserError(f"benchmark '{benchmark}' reads no dataset from disk (it takes no root)", where=PROG,
                        fix="check a benchmark that takes --root, e.g. core50, office-home, cifar10-dirichlet")
    if root is None and parameter.default is inspect.Parameter.empty:
        raise UserError(f"benchmark '{benchmark}' needs --root (it has no default location)", where=PROG,
                        fix=f"run '{PROG} {benchmark} --root DIR' (see docs/datasets.md)")
    args = {**({"root": root} if root is not None else {}), **init_args}
    check_init_args(target, args, f"{PROG}: {benchmark}")
    return target, args


def build(benchmark: str, root: str | None, **init_args):
    """(spec, experiences in default order) of ``benchmark`` built from ``root``."""
    from clbench.data.streams import ordered_experiences, spec_of

    target, args = _builder(benchmark, root, init_args)
    scenario = target(**args)
    return spec_of(scenario), ordered_experiences(scenario, "default")


def summarize(benchmark: str, root: str | None, spec, experiences) -> Summary:
    from clbench.data.datasets import targets_of

    labelled = spec.num_classes is not None  # text records (TRACE) have no classes to count
    rows = []
    for exp in experiences:
        counts = targets_of(exp.train).bincount(minlength=spec.num_classes).tolist() if labelled else []
        rows.append(ExperienceSummary(name=exp.name, domain_id=int(exp.domain_id), classes=list(exp.classes),
                                      train=len(exp.train), test=len(exp.test),
                                      train_class_counts={c: int(n) for c, n in enumerate(counts) if n}))
    where = str(root) if root is not None else "its default location"
    return Summary(benchmark=benchmark, root=where, stream=spec.name, scenario_type=spec.scenario_type,
                   num_classes=spec.num_classes or 0, input_shape=list(spec.input_shape or []), experiences=rows,
                   objective=spec.objective,
                   shared_test=len(experiences) > 1 and len({id(e.test) for e in experiences}) == 1,
                   named_orders=sorted({"default", "reverse", *spec.named_orders}),
                   global_test=len(spec.global_test) if spec.global_test is not None else None,
                   class_names=spec.class_names)


def verify(experiences, threads: int = 8) -> int:
    """Decode every image file the experiences read; the number checked, or a UserError naming
    the first corrupt file (and how many more there are)."""
    from clbench.benchmarks.images import verify_images

    paths = sorted({p for exp in experiences for d in (exp.train, exp.test) for p in image_paths(d)})
    bad = verify_images(paths, workers=threads)
    if bad:
        more = f" (and {len(bad) - 1} more corrupt: {', '.join(p for p, _ in bad[1:4])}" \
               f"{', ...' if len(bad) > 4 else ''})" if len(bad) > 1 else ""
        raise UserError(f"{bad[0][1]}{more}", where=bad[0][0],
                        fix="re-extract the dataset archive or delete the corrupt file")
    return len(paths)


def check(benchmark: str, root: str | None, *, decode: bool = True, threads: int = 8, **init_args) -> Summary:
    """Build ``benchmark`` from ``root`` (a UserError names whatever is missing), decode every
    image file when ``decode``, and summarise the stream."""
    spec, experiences = build(benchmark, root, **init_args)
    summary = summarize(benchmark, root, spec, experiences)
    if decode:
        summary.images_checked = verify(experiences, threads)
    return summary


def measure_speed(train, *, batches: int = 20, workers: int = 8, batch_size: int = 128) -> dict[str, float]:
    """Training images per second through a shuffled loader over ``train`` (after one warm-up
    batch, so worker start-up is not counted)."""
    import time

    from clbench.data.datasets import make_loader

    loader = make_loader(train, batch_size, shuffle=True, seed=0, num_workers=workers)
    it = iter(loader)
    next(it)
    images, start = 0, time.perf_counter()
    for _ in range(batches):
        try:
            x, _y = next(it)
        except StopIteration:
            it = iter(loader)
            x, _y = next(it)
        images += len(x)
    seconds = time.perf_counter() - start
    rate = images / seconds if seconds > 0 else float("inf")
    return {"images_per_second": rate, "workers": workers, "batch_size": batch_size,
            "images_per_second_per_worker": rate / max(workers, 1)}
