"""``result.json``: what a finished run reports.

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

import math
from dataclasses import dataclass
from typing import Any

from clbench.config.load import SCHEMA_VERSION, config_hash, order_label
from clbench.metrics.derive import derive_scores, mean_or_none
from clbench.metrics.stderr import score_stderr
from clbench.results.record import Status


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
    """The CPU a run computed on: its model name, the instruction set torch's kernels use
    (``torch.backends.cpu.get_cpu_capability()``: ``AVX2``, ``AVX512``, ...), ``pin``, the
    level ATen's, MKL's and oneDNN's kernels were all pinned to (:mod:`clbench.cpu_kernels`;
    None: each chose by this CPU), which ``leaderboard verify`` reruns with, and ``vendor``
    (``GenuineIntel``, ``AuthenticAMD``): MKL's pinned branches are one vendor's."""
    import platform

    import torch

    from clbench.cpu_kernels import cpu_vendor, pinned_level

    model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:  # Linux: the marketing name
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), None)
    except OSError:
        pass
    return {"model": model or platform.processor() or platform.machine() or "unknown",
            "isa": torch.backends.cpu.get_cpu_capability(), "pin": pinned_level(), "vendor": cpu_vendor()}


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


def _column_matrices(rows: list[dict]) -> dict[str, list[list]]:
    """name -> matrix for every metric the columns report (rows of :class:`~clbench.engine.state.ColumnValues`)."""
    names = list(rows[-1]["metrics"]) if rows else []
    return {name: [row["metrics"][name] for row in rows] for name in names}


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
    r_stderr = [row["stderr"] for row in state["rows"]]
    r_init_stderr = state["r_init"]["stderr"]
    return {"r_stderr": r_stderr, "r_init_stderr": r_init_stderr, "r_n": state["rows"][-1]["n"],
            "scores_stderr": score_stderr(r, r_stderr, r_init, r_init_stderr, single_stage=single_stage,
                                          higher_is_better=higher_is_better)}


def _per_stage(stages: list[dict]) -> dict[str, list]:
    """``{name: [value per stage]}`` from the loop's per-stage ``{name: value}`` records."""
    names = list(dict.fromkeys(name for stage in stages for name in stage))
    return {name: [stage.get(name) for stage in stages] for name in names}


def n_eff_by_stage(compositions: list[dict], experiences: list[str], domains: list[int]) -> list[dict | None]:
    """Per stage: the old tasks N_eff was measured on (the experiences before the stage's, of
    another domain; ``experiences`` and their ``domains`` in run order), its per-layer values and
    their mean (the ``n_eff`` score at the final stage); None where nothing was measured (the
    first stage)."""
    out: list[dict | None] = []
    for stage, layers in enumerate(compositions):
        values = {name: figures["n_eff"] for name, figures in layers.items()}
        old = [name for name, domain in zip(experiences[:stage], domains[:stage]) if domain != domains[stage]]
        out.append({"old_tasks": old, "mean": mean_or_none(list(values.values())), "layers": values}
                   if values else None)
    return out


@dataclass(frozen=True)
class RunSummary:
    """What :func:`assemble` needs to know of a finished run besides its loop state: plain
    values the engine reads off its objects (:func:`clbench.engine.summary.run_summary`),
    so that this module never holds the run, its model or its strategy."""

    cfg: dict
    scenario_type: str
    num_classes: int | None
    objective: dict[str, Any]           # {"name": class name, **objective.summary()}
    higher_is_better: bool              # the objective's direction: R's and the CL scores'
    column_names: list[str]             # R's metric, per experience column
    metrics: dict[str, dict[str, Any]]  # title, direction and unit of every metric computed
    experiences: list[str]              # names, in run order
    domains: list[int]                  # each experience's domain id
    single_stage: bool
    precision: str                      # the Trainer's: "32-true", "bf16-mixed" (clbench.engine.precision)
    params_total: int
    params_trainable: int
    adapter_scales: list[float]
    strategy_class: str                 # "module:QualName"
    strategy_params: dict[str, Any]
    strategy_diagnostics: dict[str, Any]
    synthetic: bool = False             # the stream's data was generated (StreamSpec.synthetic)


def assemble(run: RunSummary, state: dict, reference: list[float] | None, wall: float,
             import_seconds: float) -> dict:
    """The result dict of a finished run: its summary, its loop state (:class:`clbench.engine.state.RunState`
    as a dict), the reference models' scores (or None) and its times."""
    from clbench.registry import plugin_source

    cfg = run.cfg
    higher = run.higher_is_better
    r = [row["primary"] for row in state["rows"]]
    r_init = state["r_init"]["primary"]
    column_names = run.column_names
    primary_names = set(column_names)
    matrices = {k: v for k, v in _column_matrices(state["rows"]).items() if k not in primary_names}
    global_test = {name: [row[name] for row in state["global_rows"]] for name in state["global_rows"][-1]} \
        if state["global_rows"] and state["global_rows"][-1] else None
    compositions = state["compositions"] if any(state.get("compositions") or []) else None
    routing_metrics = _per_stage(state.get("routing_metrics") or [])
    scores = derive_scores(r, r_init, reference, single_stage=run.single_stage, higher_is_better=higher,
                           matrices=matrices, global_test=global_test, compositions=compositions,
                           routing=routing_metrics)
    result: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "status": Status.OK,
        "benchmark": {"name": cfg["benchmark"]["class_path"], "init_args": cfg["benchmark"]["init_args"],
                      "scenario_type": run.scenario_type, "num_classes": run.num_classes,
                      **({"synthetic": True} if run.synthetic else {})},
        "objective": run.objective,
        "model": {"name": cfg["model"]["class_path"], "init_args": cfg["model"]["init_args"],
                  "params_total": run.params_total, "params_trainable": run.params_trainable,
                  **({"adapter_scales": run.adapter_scales} if run.adapter_scales else {})},
        "strategy": {"name": cfg["strategy"]["class_path"],
                     "class": run.strategy_class,
                     "params": run.strategy_params,
                     "source": plugin_source(cfg["strategy"]["class_path"]),
                     **({"diagnostics": run.strategy_diagnostics} if run.strategy_diagnostics else {})},
        "seed": cfg["seed"],
        "order": cfg["order"],
        "order_label": order_label(cfg["order"]),
        "experiences": list(run.experiences),
        "single_stage": run.single_stage,  # joint training: one row of R (clbench.results.record.single_stage)
        "r_metric": {"names": column_names, "higher_is_better": higher},
        "r_matrix": r,
        "r_init": r_init,
        **sampling(state, r, r_init, single_stage=run.single_stage, higher_is_better=higher),
        "matrices": matrices,
        # title, direction and unit of every metric the columns computed, read from its class or
        # declaration (clbench.metrics.declared): what tables rank and head its scores by
        "metrics": run.metrics,
        "scores": scores,
    }
    if global_test is not None:
        result["global_test"] = global_test
        result["global_test_init"] = dict(state["global_init"])
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
        result["n_eff"] = n_eff_by_stage(compositions, run.experiences, run.domains)
    if routing_metrics:
        # per declared routing metric (clbench.metrics.declare_routing): its value at each stage
        result["routing_metrics"] = routing_metrics
    if any(state.get("train_routing") or []):
        result["train_expert_utilization"] = state["train_routing"]  # the same, while each experience trained
    if state["epoch_rows"]:
        result["r_epochs"] = [row["primary"] for row in state["epoch_rows"]]
        result["epoch_stage"] = state["epoch_stage"]
        result["epoch_scores"] = [] if run.single_stage else epoch_scores(
            result["r_epochs"], state["epoch_stage"], r_init, reference, higher_is_better=higher)
    result.update({
        "config": cfg,
        "config_hash": config_hash(cfg),
        "env": {**environment(), "precision": run.precision},
        "compute": {"wall_seconds": round(wall, 3), "train_seconds": round(state["train_seconds"], 3),
                    "eval_seconds": round(state["eval_seconds"], 3), "import_seconds": round(import_seconds, 3),
                    "resumes": state["resumes"], **peak_memory_mb()},
    })
    if state.get("pretrain"):  # the held-out subset's record (clbench.engine.pretrain)
        result["pretrain"] = {**state["pretrain"], "r_pretrained": r_init}
    return finite_or_none(result)
