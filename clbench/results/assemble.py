"""``result.json``: what a finished run reports, and its TensorBoard summary.

The R matrix holds each test column's primary score (the objective's first metric: accuracy
for classification, an error for regression); ``r_metric`` names it and its direction, and the
CL scores follow that direction. Every other metric of the columns is a matrix of its own under
``matrices``, with its final-row mean as ``scores["<name>_final"]``; ``metrics`` records each
metric's title, direction and unit, as its class or declaration says
(:mod:`clbench.metrics.declared`), for the tables that rank by them. A single-stage strategy
(joint training) has one row and reports only ``acc`` (its final mean). Every score comes from
:func:`clbench.metrics.derive.derive_scores`, the function :mod:`clbench.leaderboard.rescore`
re-scores entries with.

Beside R, ``r_stderr`` holds each cell's standard error from its test set (``r_n`` the test
sets' sizes) and ``scores_stderr`` what those make of ACC, AIA, BWT and FWT
(:mod:`clbench.metrics.stderr`); result schema 2 added them, and a reader of a schema-1 result
takes them as unknown.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clbench.config.load import SCHEMA_VERSION, config_hash, order_label
from clbench.metrics.derive import derive_scores, mean_or_none
from clbench.metrics.stderr import N_KEY, SAMPLING_KEYS, STDERR_KEY, score_stderr
from clbench.results.record import Status


@dataclass
class RunState:
    """What the loop has produced so far; stored in every checkpoint as a plain dict.

    A row is ``{metric: [value per column]}`` with ``"primary"`` the R-matrix entries.
    """

    stage: int = 0
    rows: list[dict] = field(default_factory=list)
    global_rows: list[dict] = field(default_factory=list)
    epoch_rows: list[dict] = field(default_factory=list)
    epoch_stage: list[int] = field(default_factory=list)
    r_init: dict | None = None
    global_init: dict | None = None
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    wall_seconds: float = 0.0
    resumes: int = 0
    routing: list[dict] = field(default_factory=list)
    train_routing: list[dict] = field(default_factory=list)
    pretrain: dict | None = None  # clbench.engine.pretrain's record, once the held-out subset has trained
    compositions: list[dict] = field(default_factory=list)
    # the last stage's per-class recall: {"columns": [per experience], "global": [...] or None}
    recall: dict | None = None

    @classmethod
    def from_dict(cls, values: dict) -> "RunState":
        known = {k: v for k, v in values.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def environment() -> dict[str, Any]:
    """Package versions, Python, platform, device and git state (:mod:`clbench.results.provenance`), for the record."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import torch

    from clbench.results.provenance import git_state

    packages = {}
    for name in ("clbench", "torch", "lightning", "torchmetrics", "avalanche-lib", "timm", "transformers", "peft",
                 "numpy", "scikit-learn"):
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            packages[name] = None
    commit, dirty = git_state()
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"
    # torch_threads and cpu are recorded because CPU results depend on them (reduction order, and
    # which vector kernels torch and MKL pick: the same run differs between an AVX2 and an AVX-512 CPU).
    return {"python": platform.python_version(), "platform": platform.platform(), "packages": packages,
            "device": device, "cuda": torch.version.cuda if torch.cuda.is_available() else None,
            "cpu": cpu_identity(), "torch_threads": torch.get_num_threads(), "git_commit": commit,
            "git_dirty": dirty}


def cpu_identity() -> dict[str, str]:
    """The CPU a run computed on: its model name and the instruction set torch's kernels use
    (``torch.backends.cpu.get_cpu_capability()``: ``AVX2``, ``AVX512``, ...; the environment
    variable ``ATEN_CPU_CAPABILITY`` lowers it)."""
    import platform

    import torch

    model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:  # Linux: the marketing name
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), None)
    except OSError:
        pass
    return {"model": model or platform.processor() or platform.machine() or "unknown",
            "isa": torch.backends.cpu.get_cpu_capability()}


def peak_memory_mb() -> dict[str, float | None]:
    import resource

    import torch

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    gpu = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    return {"cpu_peak_rss_mb": round(rss, 1), "gpu_peak_allocated_mb": round(gpu, 1) if gpu is not None else None}


def finite_or_none(value: Any) -> Any:
    """NaN/Inf (a score undefined on this data, e.g. MAUC on a one-class test set) -> None,
    so result.json is strict JSON and readers see ``null`` for "undefined"."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def _column_matrices(rows: list[dict[str, list]]) -> dict[str, list[list]]:
    """name -> matrix for every metric the columns report, besides the primary score."""
    names = [name for name in rows[-1] if name != "primary" and name not in SAMPLING_KEYS] if rows else []
    return {name: [row[name] for row in rows] for name in names}


def epoch_scores(r_epochs, epoch_stage, r_init, reference, *, higher_is_better: bool) -> list[dict]:
    """Scores on the intermediate R matrix after every epoch (thesis appendix A.11).

    After an epoch of stage i, the matrix is the finished rows 0..i-1 plus the current
    epoch's row as row i; scores are computed on that (i+1) x (i+1) leading block, so they
    track how forgetting and intransigence evolve within an experience.
    """
    from clbench.metrics import cl_scores

    out = []
    finished: list[list[float]] = []
    for k, (row, stage) in enumerate(zip(r_epochs, epoch_stage)):
        if len(finished) < stage:  # rows of completed stages are their last epoch's rows
            finished.append(r_epochs[k - 1])
        block = [r[: stage + 1] for r in finished[:stage]] + [row[: stage + 1]]
        scores = cl_scores(block, r_init=r_init[: stage + 1], reference=reference[: stage + 1] if reference else None,
                           higher_is_better=higher_is_better)
        out.append({"epoch": k, "stage": stage, **scores})
    return out


def sampling(state: dict, r: list, r_init: list, *, single_stage: bool, higher_is_better: bool) -> dict[str, Any]:
    """The test sets' noise (:mod:`clbench.metrics.stderr`): ``r_stderr`` (each R cell's standard
    error, None where the metric gives none), ``r_init_stderr``, ``r_n`` (each test column's
    sample count) and ``scores_stderr`` (ACC, AIA, BWT, FWT, cells taken as independent). Rows
    restored from a checkpoint written before the errors were recorded read as None."""
    r_stderr = [row.get(STDERR_KEY) or [None] * len(row["primary"]) for row in state["rows"]]
    r_init_stderr = state["r_init"].get(STDERR_KEY) or [None] * len(r_init)
    return {"r_stderr": r_stderr, "r_init_stderr": r_init_stderr,
            "r_n": state["rows"][-1].get(N_KEY) or [None] * len(r_init),
            "scores_stderr": score_stderr(r, r_stderr, r_init, r_init_stderr, single_stage=single_stage,
                                          higher_is_better=higher_is_better)}


def n_eff_by_stage(compositions: list[dict], experiences: list) -> list[dict | None]:
    """Per stage: the old tasks N_eff was measured on (the experiences before the stage's, of
    another domain), its per-layer values and their mean (the ``n_eff`` score at the final
    stage); None where nothing was measured (the first stage)."""
    out: list[dict | None] = []
    for stage, layers in enumerate(compositions):
        values = {name: figures["n_eff"] for name, figures in layers.items()}
        old = [e.name for e in experiences[:stage] if e.domain_id != experiences[stage].domain_id]
        out.append({"old_tasks": old, "mean": mean_or_none(list(values.values())), "layers": values}
                   if values else None)
    return out


def adapter_scales(model) -> list[float]:
    """The distinct scales α/r of the model's adapter layers (peft's LoRA, O-LoRA's task LoRAs,
    LoRA experts, MoSEs' sub-experts: every module with ``lora_A`` and a ``scaling``), as they
    ran: what suites keep equal across the methods they compare."""
    found: set[float] = set()
    for module in model.modules():
        scaling = getattr(module, "scaling", None) if hasattr(module, "lora_A") else None
        values = scaling.values() if isinstance(scaling, dict) else [scaling]
        found.update(float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool))
    return sorted(found)


def recorded_metrics(run) -> dict[str, dict[str, Any]]:
    """``metrics`` of ``result.json`` (:func:`clbench.metrics.declared.recorded`) for the metrics
    of the run's test columns, as the objective and the strategy declared them."""
    from clbench.metrics.declared import contributed, recorded

    specs = {**run.objective.metric_specs(), **contributed(run.objective, run.strategy)}
    return recorded(run.module.eval_metrics, specs)


def assemble(run, state: dict, reference: list[float] | None, wall: float, import_seconds: float) -> dict:
    """The result dict of a finished :class:`clbench.engine.runner.ContinualRun`."""
    from clbench.plugins.registry import plugin_source

    cfg = run.cfg
    higher = run.objective.higher_is_better
    r = [row["primary"] for row in state["rows"]]
    r_init = state["r_init"]["primary"]
    column_names = run.columns.per_experience(run.module.primary)  # R's metric, per experience column
    primary_names = set(column_names)
    matrices = {k: v for k, v in _column_matrices(state["rows"]).items() if k not in primary_names}
    global_test = {name: [row[name] for row in state["global_rows"]] for name in state["global_rows"][-1]
                   if name != "primary" and name not in SAMPLING_KEYS} \
        if state["global_rows"] and state["global_rows"][-1] else None
    compositions = state["compositions"] if any(state.get("compositions") or []) else None
    scores = derive_scores(r, r_init, reference, single_stage=run.strategy.single_stage, higher_is_better=higher,
                           matrices=matrices, global_test=global_test, compositions=compositions)
    model = run.module.model
    result: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "status": Status.OK,
        "benchmark": {"name": cfg["benchmark"]["class_path"], "init_args": cfg["benchmark"]["init_args"],
                      "scenario_type": run.spec.scenario_type, "num_classes": run.spec.num_classes},
        "objective": {"name": type(run.objective).__name__, **run.objective.summary()},
        "model": {"name": cfg["model"]["class_path"], "init_args": cfg["model"]["init_args"],
                  "params_total": sum(p.numel() for p in model.parameters()),
                  "params_trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
                  **({"adapter_scales": scales} if (scales := adapter_scales(model)) else {})},
        "strategy": {"name": cfg["strategy"]["class_path"],
                     "class": f"{type(run.strategy).__module__}:{type(run.strategy).__qualname__}",
                     "params": run.strategy.hparams(),
                     "source": plugin_source(cfg["strategy"]["class_path"]),
                     **({"diagnostics": diagnostics} if (diagnostics := run.strategy.diagnostics()) else {})},
        "seed": cfg["seed"],
        "order": cfg["order"],
        "order_label": order_label(cfg["order"]),
        "experiences": [exp.name for exp in run.experiences],
        "single_stage": run.strategy.single_stage,  # joint training: one row of R (clbench.results.record.single_stage)
        "r_metric": {"names": column_names, "higher_is_better": higher},
        "r_matrix": r,
        "r_init": r_init,
        **sampling(state, r, r_init, single_stage=run.strategy.single_stage, higher_is_better=higher),
        "matrices": matrices,
        # title, direction and unit of every metric the columns computed, read from its class or
        # declaration (clbench.metrics.declared): what tables rank and head its scores by
        "metrics": recorded_metrics(run),
        "scores": scores,
    }
    if global_test is not None:
        result["global_test"] = global_test
        result["global_test_init"] = {k: v for k, v in state["global_init"].items()
                                      if k != "primary" and k not in SAMPLING_KEYS}
    if state.get("recall"):
        # after the last stage, each class's recall (None: absent) per test experience and on the
        # stream-wide test set: which classes make a G-mean 0 (one never predicted is enough)
        result["recall_final"] = state["recall"]
    if reference is not None:
        result["reference"] = reference
    if state.get("routing"):
        # per stage, per MoE layer: utilization[d][e] (fraction of domain d's units routed to
        # expert e), routing entropy and load imbalance (clbench.metrics.ExpertUtilization)
        result["expert_utilization"] = state["routing"]
    if compositions is not None:
        # per stage, per MoE layer: route-wise N_eff over the test units of the experiences before
        # that stage's (clbench.metrics.compositions; empty at the first stage, where there are
        # none); the score is the final stage's mean over layers
        result["route_compositions"] = compositions
        result["n_eff"] = n_eff_by_stage(compositions, run.experiences)
    if any(state.get("train_routing") or []):
        result["train_expert_utilization"] = state["train_routing"]  # the same, while each experience trained
    if state["epoch_rows"]:
        result["r_epochs"] = [row["primary"] for row in state["epoch_rows"]]
        result["epoch_stage"] = state["epoch_stage"]
        result["epoch_scores"] = [] if run.strategy.single_stage else epoch_scores(
            result["r_epochs"], state["epoch_stage"], r_init, reference, higher_is_better=higher)
    result.update({
        "config": cfg,
        "config_hash": config_hash(cfg),
        "env": environment(),
        "compute": {"wall_seconds": round(wall, 3), "train_seconds": round(state["train_seconds"], 3),
                    "eval_seconds": round(state["eval_seconds"], 3), "import_seconds": round(import_seconds, 3),
                    "resumes": state["resumes"], **peak_memory_mb()},
    })
    return finite_or_none(result)


@functools.lru_cache(maxsize=None)
def tensorboard_class():
    """The TensorBoard logger class a run uses (Lightning's, finalized once per run)."""
    from lightning.pytorch.loggers import TensorBoardLogger

    class RunLogger(TensorBoardLogger):
        def finalize(self, status: str) -> None:
            if self._experiment is not None:
                self._experiment.flush()

        def close(self) -> None:
            # Lightning saves hparams.yaml whenever it saves the logger and never overwrites it;
            # the one written before the hyper-parameters were known is replaced.
            Path(self.log_dir, self.NAME_HPARAMS_FILE).unlink(missing_ok=True)
            super().finalize("success")

    return RunLogger


def tensorboard_logger(folder: Path, name: str, purge_step: int | None = None, **options: Any):
    """A Lightning TensorBoard logger that keeps one event stream for the whole run.

    Lightning finalizes its logger after every ``fit``, which closes the writer, so each
    experience used to open a new event file, and saved an empty ``hparams.yaml``. Here
    ``finalize`` only flushes; :func:`log_tensorboard` closes the stream once, after writing the
    hyper-parameters with the final scores as TensorBoard hparams.
    """
    extra = {"purge_step": purge_step} if purge_step is not None else {}
    settings = {"save_dir": str(folder), "name": name, "version": "", "default_hp_metric": False, **extra, **options}
    return tensorboard_class()(**settings)


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as ``{"a.b.c": leaf}``; a leaf keeps its type (None, a list, ...), an
    empty mapping is a leaf ``{}``."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def hyperparameters(result: dict) -> dict[str, Any]:
    """Every leaf of the resolved config under its dotted path (``model.init_args.hidden``) with
    its own type, plus the components' display names, the order's label and the strategy's
    full ``__init__`` arguments (defaults included): one flat mapping for every logger."""
    out = flatten(result["config"])
    out.update({"benchmark.name": result["benchmark"]["name"], "model.name": result["model"]["name"],
                "strategy.name": result["strategy"]["name"], "order_label": result["order_label"]})
    out.update({f"strategy.params.{k}": v for k, v in flatten(result["strategy"]["params"] or {}).items()})
    return out


def log_tensorboard(logger, result: dict) -> None:
    """The R matrix per test experience, the final scores, the heatmap and the hparams, then close."""
    from clbench.results.plots import r_matrix_figure, routing_layers, utilization_figure

    writer = logger.experiment
    metric = "/".join(dict.fromkeys(result["r_metric"]["names"]))
    for i, row in enumerate(result["r_matrix"]):
        for name, value in zip(result["experiences"], row):
            if value is not None:
                writer.add_scalar(f"eval/{metric}/{name}", value, i)
    for k, scores in enumerate(result.get("epoch_scores", [])):
        for key, value in scores.items():
            if isinstance(value, (int, float)) and key not in ("epoch", "stage"):
                writer.add_scalar(f"epoch_scores/{key}", value, k)
    for name, value in zip(result["experiences"], result.get("r_init") or []):
        if value is not None:
            writer.add_scalar(f"eval_untrained/{metric}/{name}", value, 0)
    writer.add_figure("r_matrix", r_matrix_figure(result), 0)
    # one heatmap per MoE layer and stage (at most 12 evenly spaced layers: an LLM has hundreds)
    for stage, _ in enumerate(result.get("expert_utilization") or []):
        for layer in routing_layers(result, 12):
            writer.add_figure(f"routing/{layer}", utilization_figure(result, [layer], stage), stage)
    # The scores are written once, as scalars under scores/ that the hparams view also reads.
    scores = {f"scores/{k}": v for k, v in result["scores"].items() if isinstance(v, (int, float))}
    logger.log_hyperparams(hyperparameters(result), metrics=scores)  # hparams.yaml keeps the types
    logger.close()
