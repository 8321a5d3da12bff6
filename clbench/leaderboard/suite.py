"""Suites: a YAML grid of runs, checked up front and expanded into resolved run configs.

::

    name: quickstart                     # names the leaderboard (letters, digits, - _ .)
    description: one line for the rendered page
    benchmarks: [digits-domains, {class_path: digits-dirichlet, init_args: {alpha: 0.3}}]
    models: [{class_path: mlp, init_args: {hidden: 128}}]
    strategies: [naive, joint, {class_path: replay, init_args: {mem_size: 200}}]
    orders: [default, reverse, {permutation: 1}]
    seeds: [0]
    threads: 1                           # optional: torch CPU threads while the suite runs
    base:                                # shared run settings laid under every grid point
      train: {epochs: 2}
      logging: {tensorboard: false}

Each grid point (benchmark x model x strategy x order x seed) becomes ``base`` with the
point's five fields laid over it, resolved by :func:`clbench.config.resolve_config`, so a run
in a suite is exactly the run ``clbench run`` would make from the same config and has the
same hash. A benchmark item may carry its own ``orders`` (orders given as experience names
only make sense for one stream). A strategy item may carry ``model_args``, laid over every
model's ``init_args`` for that strategy's points: a method defined on adapters (EWC or GEM on
LoRA) beside one that trains the whole model, in one grid. Every mistake is reported before any run starts, as one
line naming the suite file and the field (``suite.yaml: strategies[2].init_args.mem_size``).

``threads`` sets torch's intra-op CPU threads for the suite's runs. It is not part of any run
config (it does not say what is computed), but it is recorded in every entry: on a small
model, a CPU shared with other work makes extra threads spin rather than help (the quickstart
suite ran over ten times faster with one thread than with two on a busy 2-core machine), and
a few reductions (e.g. EWC's Fisher) can round differently with another thread count.

``launcher`` holds the defaults of ``--launcher local`` and ``--launcher slurm`` (workers,
partition, GPUs, time limit, extra ``#SBATCH`` options; see docs/cluster.md). Like ``threads``
it says where the runs go, not what they compute, so it is in no run config and no hash.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clbench.config import check_order, config_hash, deep_merge, order_label, read_yaml, resolve_config
from clbench.errors import UserError, did_you_mean

SUITE_KEYS = ("name", "description", "benchmarks", "models", "strategies", "orders", "seeds", "base", "threads",
              "launcher")
# ``launcher:`` settings per launcher (docs/cluster.md); like ``threads``, never part of a run config.
LAUNCHER_KEYS = {"local": ("jobs",),
                 "slurm": ("partition", "gpus_per_node", "cpus_per_task", "timeout_min", "mem_gb", "jobs",
                           "additional", "setup")}
REQUIRED_KEYS = ("name", "benchmarks", "models", "strategies", "orders", "seeds")
# Run-config fields the grid sets; ``base`` may not set them too.
GRID_FIELDS = {"seed": "seeds", "benchmark": "benchmarks", "model": "models", "strategy": "strategies",
               "order": "orders"}
_KIND = {"benchmarks": "benchmarks", "models": "models", "strategies": "strategies"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
DEFAULT_SUITE = Path("configs") / "suites" / "quickstart.yaml"


@dataclass(frozen=True)
class RunSpec:
    """One grid point: its resolved config, content hash and the labels tables use."""

    index: int
    config: dict
    hash: str
    benchmark: str
    model: str
    strategy: str
    order: str
    seed: int

    def label(self) -> str:
        return f"{self.strategy} · {self.benchmark} · {self.model} · order {self.order} · seed {self.seed}"


@dataclass
class Suite:
    """A checked suite and its expanded runs, in grid order."""

    name: str
    description: str
    path: Path
    runs: list[RunSpec]
    # field name (e.g. "strategies[2]") -> component, for the pre-flight signature check
    components: dict[str, list[tuple[str, dict]]] = field(default_factory=dict)
    base: dict = field(default_factory=dict)
    threads: int | None = None
    launcher: dict = field(default_factory=dict)  # {"slurm": {...}, "local": {...}}, checked

    def manifest(self) -> dict:
        """What ``DIR/suite.json`` records: which hashes make up this leaderboard."""
        source = self.path
        try:  # relative to the working directory when it is inside it, so the manifest reads the same anywhere
            source = self.path.resolve().relative_to(Path.cwd().resolve())
        except ValueError:
            pass
        return {"name": self.name, "description": self.description, "source": str(source),
                "threads": self.threads,
                "runs": [{"hash": r.hash, "strategy": r.strategy, "benchmark": r.benchmark, "model": r.model,
                          "order": r.order, "seed": r.seed} for r in self.runs]}


def default_suite_path() -> Path:
    """The quickstart suite: ``./configs/suites/quickstart.yaml``, else the one beside the package."""
    if (Path.cwd() / DEFAULT_SUITE).is_file():
        return DEFAULT_SUITE
    beside = Path(__file__).resolve().parents[2] / DEFAULT_SUITE
    if beside.is_file():
        return beside
    raise UserError(f"no default suite: {DEFAULT_SUITE} not found here or beside the clbench package",
                    where="--suite", fix="pass --suite PATH")


def _looks_like_path(name: str) -> bool:
    return ":" in name or "." in name or "/" in name


def _component(item: Any, where: str, kind: str, extra: tuple[str, ...] = ()) -> dict:
    """``name`` or ``{class_path, init_args}`` -> a component mapping; short names must be registered."""
    from clbench.registry import available

    if isinstance(item, str):
        item = {"class_path": item}
    if not isinstance(item, dict):
        raise UserError(f"expected a name or a mapping with class_path, got {type(item).__name__} {item!r}",
                        where=where, fix="write e.g. 'naive' or {class_path: replay, init_args: {mem_size: 200}}")
    allowed = ("class_path", "init_args", *extra)
    for key in item:
        if key not in allowed:
            raise UserError(f"unknown key '{key}'", where=f"{where}.{key}", fix=did_you_mean(str(key), allowed))
    name = item.get("class_path")
    if not isinstance(name, str) or not name:
        raise UserError("missing class_path", where=f"{where}.class_path", fix=f"run 'clbench list {kind}'")
    init_args = item.get("init_args") or {}
    if not isinstance(init_args, dict):
        raise UserError(f"init_args must be a mapping, got {type(init_args).__name__}", where=f"{where}.init_args",
                        fix="write init_args as 'key: value' lines")
    if not _looks_like_path(name):
        names = available(kind)
        if name not in names:
            raise UserError(f"unknown {kind[:-1]} '{name}'", where=f"{where}.class_path",
                            fix=did_you_mean(name, names))
    out = {"class_path": name, "init_args": dict(init_args)}
    for key in extra:
        if key in item:
            out[key] = item[key]
    return out


def _non_empty_list(raw: dict, key: str, source: str) -> list:
    value = raw[key]
    if not isinstance(value, list) or not value:
        raise UserError(f"expected a non-empty list, got {value!r}", where=f"{source}: {key}",
                        fix=f"write {key} as a YAML list, e.g. {key}: [...]")
    return value


def _orders(value: Any, where: str) -> list:
    if not isinstance(value, list) or not value:
        raise UserError(f"expected a non-empty list of orders, got {value!r}", where=where,
                        fix="write e.g. orders: [default, reverse, {permutation: 1}]")
    for i, order in enumerate(value):
        check_order(order, f"{where}[{i}]")
    labels = [order_label(o) for o in value]
    repeated = sorted({lab for lab in labels if labels.count(lab) > 1})
    if repeated:
        raise UserError(f"order {repeated[0]} is listed twice", where=where, fix="list each order once")
    return value


def load_suite(path: str | Path) -> Suite:
    """Read, check and expand the suite at ``path``; a :class:`UserError` names the first problem."""
    path = Path(path)
    source = str(path)
    if not path.exists():
        raise UserError(f"suite file {path} does not exist", where="--suite",
                        fix="give a suite YAML, e.g. configs/suites/quickstart.yaml")
    raw = read_yaml(path)
    for key in raw:
        if key not in SUITE_KEYS:
            raise UserError(f"unknown key '{key}'", where=f"{source}: {key}", fix=did_you_mean(str(key), SUITE_KEYS))
    for key in REQUIRED_KEYS:
        if key not in raw:
            raise UserError(f"missing '{key}'", where=source, fix=f"add a '{key}:' entry (see docs/leaderboard.md)")
    name = raw["name"]
    if not isinstance(name, str) or not _NAME.match(name):
        raise UserError(f"invalid suite name {name!r}", where=f"{source}: name",
                        fix="use letters, digits, '-', '_' or '.', starting with a letter or digit")
    description = raw.get("description") or ""
    if not isinstance(description, str):
        raise UserError("description must be a string", where=f"{source}: description", fix="write one line of text")

    base = raw.get("base") or {}
    if not isinstance(base, dict):
        raise UserError(f"expected a mapping, got {type(base).__name__}", where=f"{source}: base",
                        fix="write base as 'key: value' lines (train, trainer, metrics, logging)")
    for key in base:
        if key in GRID_FIELDS:
            raise UserError(f"'{key}' is set by the grid", where=f"{source}: base.{key}",
                            fix=f"list it under '{GRID_FIELDS[key]}' instead")
    resolve_config(base, source=f"{source}: base")  # type-check the shared settings once

    components: dict[str, list[tuple[str, dict]]] = {}
    for key in ("benchmarks", "models", "strategies"):
        items = _non_empty_list(raw, key, source)
        extra = {"benchmarks": ("orders",), "strategies": ("model_args",)}.get(key, ())
        components[key] = [(f"{key}[{i}]", _component(item, f"{source}: {key}[{i}]", _KIND[key], extra))
                           for i, item in enumerate(items)]
    orders = _orders(raw["orders"], f"{source}: orders")
    for where, strat in components["strategies"]:
        if not isinstance(strat.get("model_args", {}), dict):
            raise UserError("model_args must be a mapping", where=f"{source}: {where}.model_args",
                            fix="write e.g. model_args: {lora: {r: 8}}")
    for where, bench in components["benchmarks"]:
        if "orders" in bench:
            bench["orders"] = _orders(bench["orders"], f"{source}: {where}.orders")
    seeds = _non_empty_list(raw, "seeds", source)
    for i, seed in enumerate(seeds):
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise UserError(f"expected a non-negative integer, got {seed!r}", where=f"{source}: seeds[{i}]",
                            fix="list integer seeds, e.g. seeds: [0, 1, 2]")
    if len(set(seeds)) != len(seeds):
        raise UserError("a seed is listed twice", where=f"{source}: seeds", fix="list each seed once")
    threads = raw.get("threads")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise UserError(f"expected a positive integer, got {threads!r}", where=f"{source}: threads",
                        fix="give the number of CPU threads, e.g. threads: 1, or remove it for torch's default")

    launcher = _launcher(raw.get("launcher"), source)

    runs: list[RunSpec] = []
    seen: dict[str, str] = {}
    for b_where, bench in components["benchmarks"]:
        bench_orders = bench.get("orders", orders)
        bench_component = {"class_path": bench["class_path"], "init_args": bench["init_args"]}
        for m_where, model in components["models"]:
            for s_where, strat in components["strategies"]:
                strategy = {"class_path": strat["class_path"], "init_args": strat["init_args"]}
                model_here = model if "model_args" not in strat else \
                    {**model, "init_args": deep_merge(model["init_args"], strat["model_args"])}
                for order in bench_orders:
                    for seed in seeds:
                        point = {"seed": seed, "benchmark": bench_component, "model": model_here,
                                 "strategy": strategy, "order": order}
                        cfg = resolve_config(deep_merge(base, point), source=source)
                        digest = config_hash(cfg)
                        here = f"{b_where} x {m_where} x {s_where} x order {order_label(order)} x seed {seed}"
                        if digest in seen:
                            raise UserError(f"{here} is the same run as {seen[digest]}", where=source,
                                            fix="remove the repeated benchmark, model or strategy")
                        seen[digest] = here
                        runs.append(RunSpec(index=len(runs), config=cfg, hash=digest,
                                            benchmark=bench["class_path"], model=model["class_path"],
                                            strategy=strategy["class_path"], order=order_label(order), seed=seed))
    return Suite(name=name, description=description.strip(), path=path, runs=runs, components=components,
                 base=base, threads=threads, launcher=launcher)


def _count(value: Any, where: str, least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise UserError(f"expected an integer of at least {least}, got {value!r}", where=where,
                        fix="give a whole number, or remove it for the default")


def _launcher(raw: Any, source: str) -> dict:
    """The checked ``launcher:`` section: ``{local: {jobs}, slurm: {partition, gpus_per_node, ...}}``."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UserError(f"expected a mapping, got {type(raw).__name__}", where=f"{source}: launcher",
                        fix="write e.g. launcher: {slurm: {partition: gpu, timeout_min: 60}}")
    out: dict[str, dict] = {}
    for name, section in raw.items():
        where = f"{source}: launcher.{name}"
        if name not in LAUNCHER_KEYS:
            raise UserError(f"unknown launcher '{name}'", where=where, fix=did_you_mean(str(name), LAUNCHER_KEYS))
        section = section or {}
        if not isinstance(section, dict):
            raise UserError(f"expected a mapping, got {type(section).__name__}", where=where,
                            fix="write its settings as 'key: value' lines")
        for key, value in section.items():
            here = f"{where}.{key}"
            if key not in LAUNCHER_KEYS[name]:
                raise UserError(f"unknown key '{key}'", where=here, fix=did_you_mean(str(key), LAUNCHER_KEYS[name]))
            if key == "partition" and not (isinstance(value, str) and value.strip()):
                raise UserError(f"expected a partition name, got {value!r}", where=here, fix="e.g. partition: gpu")
            if key in ("jobs", "cpus_per_task", "timeout_min"):
                _count(value, here, 1)
            if key == "gpus_per_node":
                _count(value, here, 0)
            if key == "mem_gb" and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise UserError(f"expected a positive number of GB, got {value!r}", where=here, fix="e.g. mem_gb: 32")
            if key == "additional" and not (isinstance(value, dict) and all(
                    isinstance(v, (str, int, float, bool)) for v in value.values())):
                raise UserError("expected a mapping of sbatch options to values", where=here,
                                fix="write e.g. additional: {account: myproject, qos: high}")
            if key == "setup" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise UserError("expected a list of shell lines", where=here,
                                fix="write e.g. setup: ['module load cuda/12.1']")
        out[name] = dict(section)
    return out


def preflight(suite: Suite) -> None:
    """Import every component and check its ``init_args`` against its signature, and every
    cell's order against its stream, before any run.

    A typo in one strategy's arguments would otherwise fail every run of that strategy, one by
    one, after minutes of work; here it is one error naming the suite field. Imports torch.
    """
    import inspect

    import lightning.pytorch as pl

    from clbench import registry
    from clbench.build import check_init_args, optimizer_factory
    from clbench.strategy import Strategy
    from clbench.trainer import RESERVED_TRAINER_ARGS

    source = str(suite.path)
    provided = {"benchmarks": (), "models": ("num_classes", "input_shape"), "strategies": ()}
    for kind, items in suite.components.items():
        for where, comp in items:
            target = registry.resolve(kind, comp["class_path"], where=f"{source}: {where}.class_path")
            if kind == "strategies" and not (inspect.isclass(target) and issubclass(target, Strategy)):
                raise UserError(f"'{comp['class_path']}' is not a clbench Strategy subclass",
                                where=f"{source}: {where}.class_path", fix="subclass clbench.strategy.Strategy")
            check_init_args(target, comp["init_args"], f"{source}: {where}.init_args", provided=provided[kind])
    if suite.runs:
        cfg = suite.runs[0].config
        optimizer_factory(cfg, f"{source}: base")
        trainer = dict(cfg["trainer"] or {})
        for key in trainer:
            if key in RESERVED_TRAINER_ARGS:
                raise UserError(f"'{key}' is set by the runner", where=f"{source}: base.trainer.{key}",
                                fix="use train.epochs / train.eval_every_epoch instead, or remove it")
        check_init_args(pl.Trainer, trainer, f"{source}: base.trainer")
    _check_orders(suite)


def _check_orders(suite: Suite) -> None:
    """Each cell's order resolved as its run will resolve it. An order that depends on the
    stream (a named order of the benchmark's own, a list of experience names) needs the stream
    built: once per benchmark, and only then; ``default``, ``reverse`` and permutations suit
    every stream."""
    from clbench.build import build_benchmark
    from clbench.config import canonical_json
    from clbench.streams import resolve_order

    source = str(suite.path)
    streams: dict[str, Any] = {}
    checked: set[tuple[str, str]] = set()
    for spec in suite.runs:
        order = spec.config["order"]
        if isinstance(order, dict) or order in ("default", "reverse"):
            continue
        benchmark = canonical_json(spec.config["benchmark"])
        if (benchmark, spec.order) in checked:
            continue
        checked.add((benchmark, spec.order))
        if benchmark not in streams:
            streams[benchmark] = build_benchmark(spec.config, source)
        resolve_order(streams[benchmark], order, where=f"{source}: orders ({spec.benchmark})")
