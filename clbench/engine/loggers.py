"""Lightning loggers named in the config (``logging.loggers``), and what a run sends them.

A run logs to any Lightning logger, several at once::

    logging:
      loggers:
        - tensorboard                                  # <output>/tensorboard (the default)
        - csv                                          # <output>/csv/metrics.csv
        - mlflow                                       # <output>/mlruns
        - {class_path: wandb, init_args: {project: cl}}   # offline unless told otherwise
        - {class_path: my_pkg.loggers:MyLogger}        # any Lightning Logger subclass

Short names are Lightning's own classes with defaults that keep a run's logs in its output
folder, one folder per logger named after it beside ``tensorboard/``: ``csv/metrics.csv`` (and
``csv/hparams.yaml``), ``mlruns/`` (an MLflow file store; MLflow keeps it in maintenance mode
behind ``MLFLOW_ALLOW_FILE_STORE``, which is set for a ``file:`` URI the config asks for),
``wandb/`` (offline unless told otherwise). ``logging.tensorboard: false`` without ``loggers``
turns logging off, as before.

What every logger receives: the training loss per step (``train/loss_step``, every
``trainer.log_every_n_steps`` steps, 1 unless the config says otherwise), the learning rate per
step (Lightning's ``LearningRateMonitor``), the epoch-mean loss (``train/loss``), the untrained
model's row (``eval_untrained/<metric>/<experience>`` at step 0), the R matrix row by row
(``eval/<metric>/<experience>`` at step = stage), the final scores (``scores/<key>``) and as
hyper-parameters every leaf of the resolved config under its dotted path
(``model.init_args.hidden``) with its own type (:func:`hyperparameters`;
MLflow stores parameters as text, ``str(value)``, so ``None`` arrives as ``'None'``). TensorBoard
also gets the R-matrix heatmap and the routing figures; a logger with artifacts (MLflow) gets
``r_matrix.png``, ``result.json`` and ``config.yaml`` (the resolved config, typed).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from clbench.errors import UserError


def logger_specs(logging: dict, source: str = "config") -> list[dict]:
    """``logging.loggers`` as ``[{class_path, init_args}]``; without ``loggers``, TensorBoard
    alone if ``logging.tensorboard`` (the default) is on. The names, their form and that none is
    given twice are checked with the rest of the config (:class:`clbench.config.schema.Logging`)."""
    from clbench.config.schema import Logging
    from clbench.config.validation import check_fields

    check_fields(logging, Logging, source, field="logging")
    items = logging.get("loggers")
    if items is None:
        return [{"class_path": "tensorboard", "init_args": {}}] if logging.get("tensorboard", True) else []
    return [{"class_path": item, "init_args": {}} if isinstance(item, str)
            else {"class_path": item["class_path"], "init_args": dict(item.get("init_args") or {})} for item in items]


def _defaults(name: str, folder: Path) -> dict[str, Any]:
    if name == "csv":
        return {"save_dir": str(folder), "name": "csv", "version": ""}
    if name == "mlflow":
        return {"tracking_uri": f"file:{(folder / 'mlruns').resolve()}", "experiment_name": "clbench",
                "run_name": folder.resolve().name}
    if name == "wandb":
        return {"save_dir": str(folder), "offline": True, "project": "clbench", "name": folder.resolve().name}
    return {}


def build_loggers(specs: list[dict], folder: Path, source: str, *, purge_step: int | None = None) -> list:
    """The Lightning loggers for a run writing into ``folder``."""
    from lightning.pytorch.loggers import Logger

    from clbench.config.schema import LOGGER_SHORT_NAMES
    from clbench import registry
    from clbench.plugins.build import call_plugin
    from clbench.engine.outputs import TENSORBOARD

    loggers = []
    for i, spec in enumerate(specs):
        name, where = spec["class_path"], f"{source}: logging.loggers[{i}]"
        if name == "tensorboard":
            loggers.append(tensorboard_logger(folder, TENSORBOARD, purge_step=purge_step, **spec["init_args"]))
            continue
        args = {**_defaults(name, folder), **spec["init_args"]}
        if name == "mlflow" and str(args.get("tracking_uri", "")).startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        target = registry.load_import_path(LOGGER_SHORT_NAMES.get(name, name), f"{where}.class_path")
        if not (isinstance(target, type) and issubclass(target, Logger)):
            raise UserError(f"'{name}' is not a Lightning Logger", where=f"{where}.class_path",
                            fix="name a subclass of lightning.pytorch.loggers.Logger")
        loggers.append(call_plugin(target, args, f"{where}.init_args", source))
    return loggers


def log_result(loggers: list, result: dict) -> None:
    """The untrained row, the R matrix, the final scores, the hyper-parameters and (to loggers
    that take them) the artifacts to every logger, then close them."""

    metric = "/".join(dict.fromkeys(result["r_metric"]["names"]))
    scores = {f"scores/{k}": v for k, v in result["scores"].items() if isinstance(v, (int, float))}
    for logger in loggers:
        if isinstance(logger, tensorboard_class()):
            log_tensorboard(logger, result)  # the same values, with the figures and the hparams view
            continue
        untrained = {f"eval_untrained/{metric}/{name}": v
                     for name, v in zip(result["experiences"], result.get("r_init") or []) if v is not None}
        if untrained:
            logger.log_metrics(untrained, step=0)
        for i, row in enumerate(result["r_matrix"]):
            values = {f"eval/{metric}/{name}": v for name, v in zip(result["experiences"], row) if v is not None}
            if values:
                logger.log_metrics(values, step=i)
        logger.log_metrics(scores, step=0)
        logger.log_hyperparams(hyperparameters(result))
        log_artifacts(logger, result)
        logger.finalize("success")


def log_artifacts(logger, result: dict) -> None:
    """``r_matrix.png``, ``result.json`` and ``config.yaml`` to a logger that stores files
    (MLflow's ``log_artifact``); other loggers are left alone."""
    experiment = getattr(logger, "experiment", None)
    run_id = getattr(logger, "run_id", None)
    if not callable(getattr(experiment, "log_artifact", None)) or run_id is None:
        return
    import tempfile

    import yaml

    from clbench.io import json_text
    from clbench.results.plots import r_matrix_figure

    with tempfile.TemporaryDirectory(prefix="clbench-artifacts-") as tmp:
        folder = Path(tmp)
        figure = r_matrix_figure(result)
        figure.savefig(folder / "r_matrix.png", dpi=120, bbox_inches="tight")
        (folder / "result.json").write_text(json_text(result))
        (folder / "config.yaml").write_text(yaml.safe_dump(result["config"], sort_keys=False))
        for name in ("r_matrix.png", "result.json", "config.yaml"):
            experiment.log_artifact(run_id, str(folder / name))


# -- TensorBoard ------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def tensorboard_class():
    """The TensorBoard logger class a run uses (Lightning's, finalized once per run)."""
    from lightning.pytorch.loggers import TensorBoardLogger

    from clbench.engine.lightning_internals import open_writer

    class RunLogger(TensorBoardLogger):
        def finalize(self, status: str) -> None:
            writer = open_writer(self)
            if writer is not None:
                writer.flush()

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
