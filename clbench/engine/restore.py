"""Loading what :mod:`clbench.engine.saved` kept: a run's model rebuilt from its saved config,
the strategy's structural changes replayed and the weights loaded (``clbench.load_model``).

Apart from :mod:`clbench.engine.saved` because it builds a :class:`~clbench.engine.runner.ContinualRun`,
and the runner writes with :mod:`clbench.engine.saved`.
"""

from __future__ import annotations

import json
from pathlib import Path

from clbench.engine.saved import FORMAT, MANIFEST, MODEL, STRATEGY_TENSORS, WEIGHTS, decode, folder_name
from clbench.errors import UserError


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


def _refuse_files(cfg: dict, where: str) -> None:
    """A received run's config may name a Python file (``path/to/x.py:Class``): importing it would
    run code from the folder, so such a config is refused unless the caller trusts it."""
    named = [cfg.get(key, {}) for key in ("benchmark", "model", "strategy", "objective")]
    named += [cfg.get("train", {}).get(key) for key in ("optimizer", "scheduler")]
    for component in named:
        path = component.get("class_path") if isinstance(component, dict) else None
        if isinstance(path, str) and ".py" in path.split(":", 1)[0]:
            raise UserError(f"the saved config names the Python file {path.split(':', 1)[0]}, which loading "
                            "would import and run", where=where, fix="pass trust_code=True if you trust its author")


def restore(run_dir: str | Path, experience: int | None = None, *, trust_code: bool = False):
    """The run's :class:`~clbench.engine.runner.ContinualRun`, built from its saved config
    (nothing trained, nothing written) with the saved strategy state and weights loaded."""
    import torch
    from safetensors.torch import load_file

    from clbench.config.load import config_hash, resolve_config
    from clbench.engine.runner import ContinualRun

    run_dir = Path(run_dir)
    folder = _folder(run_dir, experience)
    where = str(folder / MANIFEST)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {folder / MANIFEST}: {err}", where=str(run_dir),
                        fix="copy the run's model folder again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UserError(f"{folder / MANIFEST} is not a clbench model of format {FORMAT}", where=str(run_dir),
                        fix="save it again with this clbench")
    if not trust_code:
        _refuse_files(manifest["config"], where)
    cfg = resolve_config(manifest["config"], source=where)  # checked as any config: it is input
    if config_hash(cfg) != manifest["config_hash"]:
        raise UserError("the saved config does not match its hash", where=where, fix="copy the run's model folder again")
    torch_threads = torch.get_num_threads()
    run = ContinualRun(cfg, None, source=where, progress=False)
    run._build()
    torch.set_num_threads(torch_threads)
    stage = manifest["experiences_trained"]
    strategy_tensors = load_file(str(folder / STRATEGY_TENSORS))
    run.strategy.load_state_dict(decode(manifest["strategy"], strategy_tensors))
    run.strategy.adapt_model(run.module.context, stage)
    model = run.module.model
    state = load_file(str(folder / WEIGHTS))
    for alias, key in manifest["tied"].items():
        state[alias] = state[key]
    current = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    for key, tensor in state.items():
        if key in current and current[key] != tuple(tensor.shape):
            raise UserError(f"the saved '{key}' has shape {tuple(tensor.shape)}, the rebuilt model's {current[key]}",
                            where=where, fix="the strategy must re-create its changes to the model in adapt_model()")
    frozen = manifest["frozen_base"]
    if frozen["names"] and run.frozen_base.digest(frozen["names"]) != frozen["digest"]:
        raise UserError("the base model's frozen weights differ from those the run trained on", where=where,
                        fix="load with the same base checkpoint (model.init_args.path) the run used")
    result = model.load_state_dict(state, strict=False)
    missing = set(result.missing_keys) - set(frozen["names"])
    if missing or result.unexpected_keys:
        name = sorted(missing)[0] if missing else sorted(result.unexpected_keys)[0]
        raise UserError(f"the saved weights {'lack' if missing else 'hold an unknown'} '{name}'", where=where,
                        fix="copy the run's model folder again")
    stages = [run.experiences[-1]] if run.strategy.single_stage else run.experiences
    last = stages[max(stage - 1, 0)]
    run.module.experience = stage - 1
    run.routing.training_domain = None if run.strategy.single_stage else last.domain_id
    model.eval()
    return run


def load_model(run_dir: str | Path, experience: int | None = None, *, trust_code: bool = False):
    """The model a run trained, rebuilt from its resolved config with the strategy's structural
    changes (adapters, MoE layers, grown MLPs) and its saved weights: after the last experience
    (``experience=None``) or after experience ``i`` (R's row ``i``; needs ``save.every_experience``).

    ``run_dir`` is the run's ``--output``; its ``model/`` folder is read with safetensors and
    JSON only. A config that names a Python file is refused unless ``trust_code``. The model
    is in eval mode, on the CPU."""
    return restore(run_dir, experience, trust_code=trust_code).module.model


def evaluate(run) -> list:
    """R's row of a restored run (:func:`restore`): every test column's primary score."""
    from clbench.engine.trainer import SigintWatch, make_trainer

    trainer = make_trainer(run.cfg, run.source, callbacks=[], logger=False, root=None)
    run.watch = SigintWatch()
    loaders = [run.make_loader(data, shuffle=False) for data in run.columns.sets]
    return run.columns.split(run.evaluate(trainer, loaders).values)[0]["primary"]
