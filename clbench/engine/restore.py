"""Loading what :mod:`clbench.engine.saved` kept: a run's model rebuilt from its saved config,
the strategy's structural changes replayed and the weights loaded (``clbench.load_model``).

Apart from :mod:`clbench.engine.saved` because it builds a run's parts
(:func:`clbench.engine.parts.build_parts`), and the runner writes with :mod:`clbench.engine.saved`.
"""

from __future__ import annotations

from pathlib import Path

from clbench.engine.saved import FORMAT, MANIFEST, MODEL, STRATEGY_TENSORS, WEIGHTS, folder_name
from clbench.errors import UserError

TRUST_FIX = "pass trust_code=True to load_model only if you trust the folder and its code"


def _folder(run_dir: Path, experience: int | None) -> Path:
    if experience is not None and (isinstance(experience, bool) or not isinstance(experience, int) or experience < 0):
        raise UserError(f"experience must be a row of R (an int >= 0) or None, got {experience!r}",
                        where="load_model", fix="give e.g. experience=0 for the model after the first experience")
    folder = run_dir / MODEL / folder_name(experience)
    if not (folder / MANIFEST).is_file():
        kept = sorted(p.name for p in (run_dir / MODEL).glob("*") if (p / MANIFEST).is_file())
        fix = (f"saved here: {', '.join(kept)}" if kept else
               "run with save: {final: true} (the default) or save: {every_experience: true}")
        raise UserError(f"{folder} holds no saved model", where=str(run_dir), fix=fix)
    return folder


def restore(run_dir: str | Path, experience: int | None = None, *, trust_code: bool = False, data: bool = False):
    """The run's :class:`~clbench.engine.parts.RunParts`, built from its saved config (nothing
    trained, nothing written) with the saved strategy state and weights loaded.

    Without ``data`` the stream comes from the folder's description of it (no dataset is
    opened, the parts have no test columns); with ``data``, or for a folder saved before streams
    were described, from the benchmark as the run built it.

    The folder may come from anyone: every file and field is checked before it is used
    (:mod:`clbench.engine.saved_check`), and, unless ``trust_code``, every component its config
    (and its stream's objective) names must be installed code
    (:func:`clbench.plugins.trusted.check_components`), checked before anything it names is imported."""
    import torch

    from clbench.config.load import config_hash, resolve_config
    from clbench.data import description
    from clbench.engine import saved_check
    from clbench.engine.parts import build_parts
    from clbench.plugins.trusted import check_components

    run_dir = Path(run_dir)
    folder = _folder(run_dir, experience)
    path = folder / MANIFEST
    where = str(path)
    manifest = saved_check.read_manifest(path, FORMAT)
    described = manifest.get("stream") if not data else None
    if not trust_code:
        check_components(manifest["config"], where, under="config.", doing="loading it", fix=TRUST_FIX)
        if described is not None:
            check_components({"objective": {"class_path": described.get("objective")}}, where, under="stream.",
                             doing="loading it", fix=TRUST_FIX)
    cfg = resolve_config(manifest["config"], source=where)  # checked as any config: it is input
    if config_hash(cfg) != manifest["config_hash"]:
        raise UserError("does not match the saved config", where=f"{where}: config_hash", fix=saved_check.FIX)
    stream = description.read(described, where, saved_check.FIX) if described is not None else None
    torch_threads = torch.get_num_threads()
    parts = build_parts(cfg, where, stream=stream)
    torch.set_num_threads(torch_threads)
    stage = manifest["experiences_trained"]
    saved_check.check_stage(stage, len(parts.stages), path)  # before the strategy's changes are replayed to it
    state = saved_check.strategy_state(manifest, saved_check.load_tensors(folder / STRATEGY_TENSORS), path,
                                       folder / STRATEGY_TENSORS)
    try:
        parts.strategy.load_state_dict(state)
        parts.strategy.adapt_model(parts.module.context, stage)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as err:
        raise UserError(f"does not fit strategy '{cfg['strategy']['class_path']}' ({type(err).__name__}: {err})",
                        where=f"{where}: strategy", fix=saved_check.FIX) from None
    model = parts.model
    state = saved_check.model_weights(model, manifest, path, folder / WEIGHTS)
    frozen = manifest["frozen_base"]
    if frozen["names"] and parts.frozen_base.digest(frozen["names"]) != frozen["digest"]:
        raise UserError("the base model's frozen weights differ from those the run trained on", where=where,
                        fix="load with the same base checkpoint (model.init_args.path) the run used")
    result = model.load_state_dict(state, strict=False)
    missing = set(result.missing_keys) - set(frozen["names"])
    if missing or result.unexpected_keys:
        name = sorted(missing)[0] if missing else sorted(result.unexpected_keys)[0]
        raise UserError(f"the saved weights {'lack' if missing else 'hold an unknown'} '{name}'",
                        where=str(folder / WEIGHTS), fix=saved_check.FIX)
    parts.module.experience = stage - 1  # what the strategy's evaluation sees: the last experience trained
    model.eval()
    return parts


def load_model(run_dir: str | Path, experience: int | None = None, *, trust_code: bool = False):
    """The model a run trained, rebuilt from its resolved config and its stream's description
    (no dataset is read) with the strategy's structural changes (adapters, MoE layers, grown
    MLPs) and its saved weights: after the last experience (``experience=None``) or after
    experience ``i`` (R's row ``i``; needs ``save.every_experience``).

    ``run_dir`` is the run's ``--output``; its ``model/`` folder is read with safetensors and
    JSON only. A config that names a component other than installed code (a Python file, a
    module in the working directory or in the folder) is refused, before it is imported, unless
    ``trust_code``. The model is in eval mode, on the CPU."""
    return restore(run_dir, experience, trust_code=trust_code).model


def evaluate(parts) -> list:
    """R's row of a run restored with its data (``restore(..., data=True)``): every test column's primary score."""
    from clbench.engine.stage import evaluate as evaluation_pass
    from clbench.engine.trainer import make_trainer

    trainer = make_trainer(parts.cfg, parts.source, callbacks=[], logger=False, root=None)
    loaders = [parts.loader(data, trainer, shuffle=False) for data in parts.columns.sets]
    return parts.columns.split(evaluation_pass(trainer, parts.module, loaders).values)[0].primary
