"""A run's trained weights, kept for others to load: ``<run>/model/``.

::

    model/final/              after the last experience (``save.final``, on by default)
    model/experience-<i>/     after experience i, 0-based as R's rows (``save.every_experience``)
        model.safetensors     the model's state dict, less a frozen base (below)
        strategy.safetensors  the tensors of the strategy's state (may be empty)
        model.json            the run's resolved config, the experiences trained, the strategy's
                              state (its tensors named into strategy.safetensors), the frozen
                              base's names and digest, tied weights' aliases, and the stream
                              described without its data (clbench.data.description)

Everything is safetensors or JSON: a folder someone sends is data, never code (no pickle). A
frozen base (a LoRA-style strategy's LLM, :class:`clbench.engine.checkpoint.FrozenBase`) is
left out as in a checkpoint and rebuilt from the config on load, its digest checked, so an
adapter run keeps only what it trained. :func:`clbench.engine.restore.restore` rebuilds the
run's model the way the runner built it (from the stream's description: no dataset is read),
replays the strategy's structural changes (``adapt_model``: LoRA layers, grown MLPs, MoE
layers) after loading its state, as a resume does, then loads the weights.
The resume checkpoint (``checkpoint.pt``) is separate and still deleted when the run finishes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def write_folder(path: Path, cfg: dict, stage: int, tensors: dict, frozen: dict, aliases: dict, strategy_state: dict,
                 stream: dict | None) -> None:
    """One weights folder: ``stage`` experiences trained. Each file is written atomically."""
    from safetensors.torch import save

    from clbench.config.load import config_hash
    from clbench.io import atomic_write, write_json

    strategy_tensors: dict = {}
    manifest = {"format": FORMAT, "experiences_trained": stage, "config": cfg, "config_hash": config_hash(cfg),
                "strategy": encode(strategy_state, strategy_tensors), "frozen_base": frozen, "tied": aliases,
                "stream": stream}
    atomic_write(path / WEIGHTS, lambda h: h.write(save(tensors, metadata={"format": "pt"})), "wb")
    atomic_write(path / STRATEGY_TENSORS, lambda h: h.write(save(strategy_tensors)), "wb")
    write_json(path / MANIFEST, manifest)


def save_after(folder: Path, parts, stage: int, total: int, write: bool = True) -> None:
    """After experience ``stage`` of a run (its :class:`~clbench.engine.parts.RunParts`, writing
    into ``folder``): its weights into ``model/experience-<stage>`` and, after the last,
    ``model/final``, as ``save:`` asks. With sharded parameters every rank calls this; those
    with ``write`` false only gather."""
    from clbench.data.description import describe

    wanted = settings(parts.cfg)
    names = ([folder_name(stage)] if wanted["every_experience"] else []) + \
        ([FINAL] if wanted["final"] and stage == total - 1 else [])
    if not names:
        return
    tensors, frozen, aliases = weights(parts.module, parts.frozen_base)
    if write:
        stream = describe(parts.spec, parts.experiences)
        for name in names:
            write_folder(folder / MODEL / name, parts.cfg, stage + 1, tensors, frozen, aliases,
                         parts.strategy.state_dict(), stream)


def load_file_keys(path: str | Path) -> list[str]:
    """The tensor names in a safetensors file (its header only)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return list(handle.keys())
