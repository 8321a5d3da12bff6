"""Suites: a YAML grid of runs, checked up front and expanded into resolved run configs.

::

    name: quickstart                     # names the leaderboard (letters, digits, - _ .)
    description: one line for the rendered page
    benchmarks: [digits-domains, {class_path: digits-dirichlet, init_args: {alpha: 0.3}}]
    models: [{class_path: mlp, init_args: {hidden: 128}}]
    strategies: [naive, joint, {class_path: replay, init_args: {mem_size: 200}}]
    orders: [default, reverse, {permutation: 1}]
    seeds: [0]
    threads: 1                           # optional: torch CPU threads while the suite runs (default: auto)
    cpu_kernels: avx2                    # optional: the CPU kernel level its runs compute at (default: avx2)
    precision: 32-true                   # optional: a CPU run's precision where its config sets none (default)
    base:                                # shared run settings laid under every grid point
      train: {epochs: 2}
      logging: {tensorboard: false}

Each grid point (benchmark x model x strategy x order x seed) becomes ``base`` with the
point's five fields laid over it, resolved by :func:`clbench.config.load.resolve_config`, so a run
in a suite is exactly the run ``clbench run`` would make from the same config and has the
same hash. A benchmark item may carry its own ``orders`` (orders given as experience names
only make sense for one stream) and its own ``strategies``, in the place of the suite's (a
method for one scenario type; settings chosen per stream), and ``train_args`` laid over
``base.train`` for its points (a strategy's ``train_args`` go over those). A strategy item may
carry ``model_args``, laid over every model's ``init_args`` for that strategy's points: a method
defined on adapters (EWC or GEM on LoRA) beside one that trains the whole model, in one grid. It may carry ``train_args`` too,
laid over ``base.train`` for its points: full fine-tuning wants a learning rate far below an
adapter's (TRACE trains the whole model at 1e-5, LoRA at 1e-4). And it may carry ``unranked``,
one sentence saying why its rows are shown below the ranking, not in it: a baseline that did not
function on the stream (full fine-tuning that never learned) would otherwise be a rank every
comparison is read against. Its runs still run and its scores are shown; the manifest keeps the
sentence and the tables print it. Every mistake is reported
before any run starts, as one line naming the suite file and the field
(``suite.yaml: strategies[2].init_args.mem_size``).
The pre-flight check also refuses adapters compared at unequal scales α/r
(:func:`clbench.leaderboard.adapter_scales.check_adapter_scales`).

The file's fields are checked by pydantic models (:class:`~clbench.leaderboard.suite_file.SuiteFile`) through the mechanism
that checks a run config (:func:`clbench.config.validation.check_fields`), and the parts that are run
config (``base``, every cell, each order) by the run config's own models
(:mod:`clbench.config.schema`): a suite cannot accept what ``clbench run`` would refuse.

``threads`` sets torch's intra-op CPU threads for the suite's runs; without it they are
decided as ``clbench run --threads auto`` decides them (:func:`clbench.limits.decide_threads`),
so a grid point and a single run of its config agree. It is not part of any run
config (it does not say what is computed), but it is recorded in every entry: on a small
model, a CPU shared with other work makes extra threads spin rather than help (the quickstart
suite ran over ten times faster with one thread than with two on a busy 2-core machine), and
a few reductions (e.g. EWC's Fisher) can round differently with another thread count.

``cpu_kernels`` and ``precision`` make the entries rerun exactly on another CPU of the same
vendor: every run computes with ATen's, MKL's and oneDNN's kernels pinned to AVX2 (:mod:`clbench.cpu_kernels`;
``native``: unpinned, the default off x86-64) and, where its config sets no ``trainer.precision``, in fp32 on any CPU
(a single ``clbench run`` of a language model takes bf16-mixed where the CPU has bf16 units:
:mod:`clbench.engine.precision`). Entries record both (``env.cpu.pin``, ``env.precision``).

``launcher`` holds the defaults of ``--launcher local`` and ``--launcher slurm`` (workers,
partition, GPUs, time limit, extra ``#SBATCH`` options; see docs/cluster.md). Like ``threads``
it says where the runs go, not what they compute, so it is in no run config and no hash.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clbench.config.load import config_hash, deep_merge, order_label, resolve_config
from clbench.config.yaml_files import read_yaml
from clbench.cpu_kernels import portable_default
from clbench.errors import UserError
from clbench.config.validation import check_fields
from clbench.leaderboard.suite_file import SuiteFile

_KIND = {"benchmarks": "benchmarks", "models": "models", "strategies": "strategies"}
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
    unranked: str | None = None  # why the suite shows this point's row below the ranking (StrategyItem)

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
    cpu_kernels: str = "native"  # clbench.cpu_kernels: a level, or native (load_suite: avx2 where it can)
    precision: str = "32-true"  # a CPU run's, where its config sets none
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
                          "order": r.order, "seed": r.seed, **({"unranked": r.unranked} if r.unranked else {})}
                         for r in self.runs]}


def default_suite_path() -> Path:
    """The quickstart suite: ``./configs/suites/quickstart.yaml``, else the one beside the package."""
    if (Path.cwd() / DEFAULT_SUITE).is_file():
        return DEFAULT_SUITE
    beside = Path(__file__).resolve().parents[2] / DEFAULT_SUITE
    if beside.is_file():
        return beside
    raise UserError(f"no default suite: {DEFAULT_SUITE} not found here or beside the clbench package",
                    where="--suite", fix="pass --suite PATH")


def _component(item: Any, where: str, kind: str, extra: tuple[str, ...] = ()) -> dict:
    """A checked item (``name`` or ``{class_path, init_args}``) -> a component mapping; short
    names must be registered (:func:`clbench.registry.check_name`, importing nothing)."""
    from clbench.registry import check_name

    if isinstance(item, str):
        item = {"class_path": item}
    name = item["class_path"]
    if not name:
        raise UserError("missing class_path", where=f"{where}.class_path", fix=f"run 'clbench list {kind}'")
    check_name(kind, name, where=f"{where}.class_path")
    out = {"class_path": name, "init_args": dict(item.get("init_args") or {})}
    for key in extra:
        if key in item:
            out[key] = item[key]
    return out


def load_suite(path: str | Path) -> Suite:
    """Read, check and expand the suite at ``path``; a :class:`UserError` names the first problem."""
    path = Path(path)
    source = str(path)
    if not path.exists():
        raise UserError(f"suite file {path} does not exist", where="--suite",
                        fix="give a suite YAML, e.g. configs/suites/quickstart.yaml")
    raw = read_yaml(path)
    check_fields(raw, SuiteFile, source)
    base = raw.get("base") or {}
    resolve_config(base, source=f"{source}: base")  # type-check the shared settings once
    components: dict[str, list[tuple[str, dict]]] = {}
    for key in ("benchmarks", "models", "strategies"):
        extra = {"benchmarks": ("orders", "strategies", "train_args"),
                 "strategies": ("model_args", "train_args", "unranked")}.get(key, ())
        components[key] = [(f"{key}[{i}]", _component(item, f"{source}: {key}[{i}]", _KIND[key], extra))
                           for i, item in enumerate(raw.get(key) or [])]
    shared = list(components["strategies"])
    per_benchmark: dict[str, list[tuple[str, dict]]] = {}  # a benchmark's own strategies, checked like the suite's
    for b_where, bench in components["benchmarks"]:
        if "strategies" in bench:
            own = [(f"{b_where}.strategies[{j}]", _component(item, f"{source}: {b_where}.strategies[{j}]",
                                                            "strategies", ("model_args", "train_args", "unranked")))
                   for j, item in enumerate(bench.pop("strategies"))]
            per_benchmark[b_where] = own
            components["strategies"] += own
    for where, item in components["strategies"] + components["benchmarks"]:  # every benchmark's own strategies too
        if "train_args" in item:  # checked as a run config's train section, named by its suite field
            resolve_config({"train": item["train_args"]}, source=f"{source}: {where}.train_args")
    orders, seeds, threads = raw["orders"], raw["seeds"], raw.get("threads")
    launcher = {name: dict(section or {}) for name, section in (raw.get("launcher") or {}).items()}

    # A grid point keeps no trained weights unless the suite asks (base.save): the entries are what a
    # leaderboard keeps, and a grid of full fine-tuning runs would otherwise leave a model per point.
    run_base = base if "save" in base else {**base, "save": {"final": False}}
    runs: list[RunSpec] = []
    seen: dict[str, str] = {}
    for b_where, bench in components["benchmarks"]:
        bench_orders = bench.get("orders", orders)
        bench_component = {"class_path": bench["class_path"], "init_args": bench["init_args"]}
        strategies = per_benchmark.get(b_where, shared)
        for m_where, model in components["models"]:
            for s_where, strat in strategies:
                strategy = {"class_path": strat["class_path"], "init_args": strat["init_args"]}
                model_here = model if "model_args" not in strat else \
                    {**model, "init_args": deep_merge(model["init_args"], strat["model_args"])}
                for order in bench_orders:
                    for seed in seeds:
                        point = {"seed": seed, "benchmark": bench_component, "model": model_here,
                                 "strategy": strategy, "order": order}
                        train = deep_merge(bench.get("train_args") or {}, strat.get("train_args") or {})
                        if train:  # the benchmark's, then the strategy's, over base.train
                            point["train"] = train
                        cfg = resolve_config(deep_merge(run_base, point), source=source)
                        digest = config_hash(cfg)
                        here = f"{b_where} x {m_where} x {s_where} x order {order_label(order)} x seed {seed}"
                        if digest in seen:
                            raise UserError(f"{here} is the same run as {seen[digest]}", where=source,
                                            fix="remove the repeated benchmark, model or strategy")
                        seen[digest] = here
                        runs.append(RunSpec(index=len(runs), config=cfg, hash=digest,
                                            benchmark=bench["class_path"], model=model["class_path"],
                                            strategy=strategy["class_path"], order=order_label(order), seed=seed,
                                            unranked=strat.get("unranked")))
    return Suite(name=raw["name"], description=(raw.get("description") or "").strip(), path=path, runs=runs,
                 components=components, base=base, threads=threads, launcher=launcher,
                 cpu_kernels=raw.get("cpu_kernels") or portable_default(), precision=raw.get("precision", "32-true"))


def preflight(suite: Suite, *, here: bool = True) -> None:
    """Check the whole grid before any run: every grid point by the run preflight
    (:func:`clbench.plugins.build.preflight`, what ``clbench run`` checks), and what is the
    suite's own: each component's ``init_args`` named by its suite field (``strategies[2]``),
    ``base.trainer``, adapter scales across strategies, and every cell's order against its
    stream. ``here``: the runs will use this machine's CPUs (not a cluster's), so ``threads`` and
    ``train.num_workers`` must fit them.

    A typo in one strategy's arguments would otherwise fail every run of that strategy, one by
    one, after minutes of work; here it is one error naming the suite field. Imports torch.
    """
    import inspect

    import lightning.pytorch as pl

    from clbench import registry
    from clbench.plugins import build
    from clbench.strategy import Strategy
    from clbench.engine.trainer import RESERVED_TRAINER_ARGS

    source = str(suite.path)
    if here:
        from clbench.limits import check_threads, check_workers

        from clbench.cpu_kernels import check_level

        if suite.threads is not None:
            check_threads(suite.threads, where=f"{source}: threads")
        check_level(suite.cpu_kernels, where=f"{source}: cpu_kernels")
        for spec in suite.runs[:1]:  # train.num_workers comes from base, the same in every cell
            check_workers(spec.config["train"]["num_workers"], where=f"{source}: base.train.num_workers")
    first = suite.runs[0].config  # base: the objective and trainer of every point
    for kind, items in suite.components.items():
        for where, comp in items:
            target = registry.resolve(kind, comp["class_path"], where=f"{source}: {where}.class_path")
            if kind == "strategies" and not (inspect.isclass(target) and issubclass(target, Strategy)):
                raise UserError(f"'{comp['class_path']}' is not a clbench Strategy subclass",
                                where=f"{source}: {where}.class_path", fix="subclass clbench.strategy.Strategy")
            # a model gets what each benchmark's objective supplies (one check per distinct set)
            supplied = {(),} if kind != "models" else {
                _model_args({**first, "benchmark": bench}, source) for _, bench in suite.components["benchmarks"]}
            for provided in supplied:
                build.check_init_args(target, comp["init_args"], f"{source}: {where}.init_args", provided=provided)
    trainer = dict(first["trainer"] or {})
    for key in trainer:
        if key in RESERVED_TRAINER_ARGS:
            raise UserError(f"'{key}' is set by the runner", where=f"{source}: base.trainer.{key}",
                            fix="use train.epochs / train.eval_every_epoch instead, or remove it")
    build.check_init_args(pl.Trainer, trainer, f"{source}: base.trainer")
    for spec in suite.runs:  # what a run checks, per point (the machine's limits were checked above)
        build.preflight(spec.config, f"{source} ({spec.label()})", here=False)
    from clbench.leaderboard.adapter_scales import check_adapter_scales

    check_adapter_scales([(run.strategy, run.config) for run in suite.runs], where=f"{source}: strategies")
    _check_orders(suite)


def _model_args(cfg: dict, source: str) -> tuple[str, ...]:
    """What the harness gives a model in a run of ``cfg`` (:func:`clbench.plugins.build.known_objective`)."""
    from clbench.plugins.build import known_objective
    from clbench.plugins.supplied import MODEL_ARGS

    objective, _ = known_objective(cfg, source)
    return MODEL_ARGS if objective is None else tuple(objective.model_args)


def _check_orders(suite: Suite) -> None:
    """Each cell's order resolved as its run will resolve it, and no two orders of a benchmark
    the same sequence of experiences (``default`` and ``[rot0, rot90]`` on a stream whose
    default is rot0, rot90; a permutation that happens to be the identity): the cells would
    run twice under two labels, doubling n and showing no spread across orders. An order that
    depends on the stream (a named order of the benchmark's own, a list of experience names),
    or a permutation beside another order, needs the stream built: once per benchmark, and
    only then; ``default`` beside ``reverse`` differ on every stream of two or more experiences."""
    from clbench.plugins.build import build_benchmark
    from clbench.config.load import canonical_json
    from clbench.data.streams import experience_names, resolve_order

    source = str(suite.path)
    cells: dict[str, dict[str, Any]] = {}  # benchmark -> order label -> a cell with that order
    for spec in suite.runs:
        cells.setdefault(canonical_json(spec.config["benchmark"]), {}).setdefault(spec.order, spec)
    for labels in cells.values():
        orders = {label: spec.config["order"] for label, spec in labels.items()}
        own = any(not (isinstance(o, dict) or o in ("default", "reverse")) for o in orders.values())
        if not own and not (len(orders) > 1 and any(isinstance(o, dict) for o in orders.values())):
            continue
        first = next(iter(labels.values()))
        where = f"{source}: orders ({first.benchmark})"
        stream = build_benchmark(first.config, source)
        seen: dict[tuple[int, ...], str] = {}
        for order in orders.values():
            indices = tuple(resolve_order(stream, order, where=where))
            if indices in seen:
                names = experience_names(stream)
                raise UserError(f"orders {seen[indices]} and {_shown_order(order)} are the same order of this "
                                f"stream ({', '.join(str(names[i]) for i in indices)})", where=where,
                                fix="list each order once")
            seen[indices] = _shown_order(order)


def _shown_order(order: Any) -> str:
    """An order as the suite file writes it: ``default``, ``[rot0, rot90]``, ``{permutation: 1}``."""
    if isinstance(order, dict):
        return f"{{permutation: {order['permutation']}}}"
    if isinstance(order, list):
        return f"[{', '.join(map(str, order))}]"
    return str(order)
