"""A run's trained weights, kept for others to load: ``<run>/model/``.

::

    model/final/              after the last experience (``save.final``, on by default)
    model/experience-<i>/     after experience i, 0-based as R's rows (``save.every_experience``)
        model.safetensors     the model's state dict, less a frozen base (below)
        strategy.safetensors  the tensors of the strategy's state (may be empty)
        model.json            the run's resolved config, the experiences trained, the strategy's
                              state (its tensors named into strategy.safetensors), the frozen
                              base's names and digest, tied weights' aliases

Everything is safetensors or JSON: a folder someone sends is data, never code (no pickle). A
frozen base (a LoRA-style strategy's LLM, :class:`clbench.engine.checkpoint.FrozenBase`) is
left out as in a checkpoint and rebuilt from the config on load, its digest checked, so an
adapter run keeps only what it trained. :func:`restore` rebuilds the run's model the way the
runner built it, replays the strategy's structural changes (``adapt_model``: LoRA layers, grown
MLPs, MoE layers) after loading its state, as a resume does, then loads the weights.
The resume checkpoint (``checkpoint.pt``) is separate and still deleted when the run finishes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clbench.errors import UserError

MODEL = "model"
FINAL = "final"
WEIGHTS = "model.safetensors"
STRATEGY_TENSORS = "strategy.safetensors"
MANIFEST = "model.json"
FORMAT = 1
DEFAULTS = {"final": True, "every_experience": False}


def settings(cfg: dict) -> dict:
    """``save:`` with its defaults (the section is optional: configs without it keep their form)."""
    return {**DEFAULTS, **(cfg.get("save") or {})}


def folder_name(experience: int | None) -> str:
    return FINAL if experience is None else f"experience-{experience}"


# -- the strategy's state as JSON plus a safetensors file ------------------------------------
def encode(value: Any, tensors: dict) -> Any:
    """``value`` as JSON, its tensors moved into ``tensors`` (named by number) and referenced."""
    import torch

    if isinstance(value, torch.Tensor):
        name = str(len(tensors))
        tensors[name] = value.detach().cpu().contiguous().clone()  # its own storage: safetensors refuses shared
        return {"__tensor__": name}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: encode(v, tensors) for k, v in value.items()}
        return {"__items__": [[encode(k, tensors), encode(v, tensors)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v, tensors) for v in value]}
    if isinstance(value, (set, frozenset)):
        return {"__set__": [encode(v, tensors) for v in sorted(value, key=repr)]}
    if isinstance(value, list):
        return [encode(v, tensors) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return {"__bytes__": bytes(value).hex()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"a strategy state value of type {type(value).__name__} cannot be saved")


def decode(value: Any, tensors: dict) -> Any:
    """Inverse of :func:`encode`."""
    if isinstance(value, list):
        return [decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"__tensor__"}:
        return tensors[value["__tensor__"]]
    if set(value) == {"__items__"}:
        return {_hashable(decode(k, tensors)): decode(v, tensors) for k, v in value["__items__"]}
    if set(value) == {"__tuple__"}:
        return tuple(decode(v, tensors) for v in value["__tuple__"])
    if set(value) == {"__set__"}:
        return {_hashable(decode(v, tensors)) for v in value["__set__"]}
    if set(value) == {"__bytes__"}:
        return bytes.fromhex(value["__bytes__"])
    return {k: decode(v, tensors) for k, v in value.items()}


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


# -- writing ----------------------------------------------------------------------------------
def weights(module, base) -> tuple[dict, dict, dict]:
    """(tensors to save, frozen base record, aliases of tied weights). With sharded parameters
    every rank must call this (it gathers them); only global rank 0's is complete."""
    from clbench.engine.sharding import model_state

    state = model_state(module.model)
    frozen: dict[str, Any] = {"names": [], "digest": None}
    if base is not None:
        names = base.names()
        if names:
            frozen = {"names": names, "digest": base.digest(names)}
            state = {k: v for k, v in state.items() if k not in set(names)}
    out, aliases, seen = {}, {}, {}
    for key, tensor in state.items():
        tensor = tensor.detach().cpu()
        ident = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                 tuple(tensor.stride()), tensor.dtype) if tensor.numel() else None
        if ident is not None and ident in seen:
            aliases[key] = seen[ident]  # tied (an LM's embedding and output layer): stored once
            continue
        if ident is not None:
            seen[ident] = key
        whole = tensor.is_contiguous() and tensor.storage_offset() == 0 and \
            tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
        out[key] = tensor if whole else tensor.contiguous().clone()
    return out, frozen, aliases


def write(path: Path, cfg: dict, stage: int, tensors: dict, frozen: dict, aliases: dict, strategy_state: dict) -> None:
    """One weights folder: ``stage`` experiences trained. Each file is written atomically."""
    from safetensors.torch import save

    from clbench.config.load import config_hash
    from clbench.io import atomic_write, write_json

    strategy_tensors: dict = {}
    manifest = {"format": FORMAT, "experiences_trained": stage, "config": cfg, "config_hash": config_hash(cfg),
                "strategy": encode(strategy_state, strategy_tensors), "frozen_base": frozen, "tied": aliases}
    atomic_write(path / WEIGHTS, lambda h: h.write(save(tensors, metadata={"format": "pt"})), "wb")
    atomic_write(path / STRATEGY_TENSORS, lambda h: h.write(save(strategy_tensors)), "wb")
    write_json(path / MANIFEST, manifest)


# -- reading ----------------------------------------------------------------------------------
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
    run.module.domain = None if run.strategy.single_stage else last.domain_id
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
    return run.columns.split(run.evaluate(trainer, loaders))[0]["primary"]


def load_file_keys(path: str | Path) -> list[str]:
    """The tensor names in a safetensors file (its header only)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return list(handle.keys())
