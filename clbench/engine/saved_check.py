"""A saved model folder (:mod:`clbench.engine.saved`) read as input that anyone may have made or
altered: each file and field is checked before it is used, and every problem is one line of
:class:`~clbench.errors.UserError` naming the file, the field and the fix.

``model.json`` is checked against :class:`Manifest` (types, and ``experiences_trained`` within
the experiences its config trains, since it picks the stage the strategy's changes are replayed
to). The safetensors files are read only if they are regular files, and safetensors' own
refusals (a header length of 2^62, overlapping offsets, a dtype that does not fit its bytes) are
worded. The weights must then fit the rebuilt model: the same shape, and the same kind of number
(a relabelled float32 tensor read as int32 has the right size but is not the same weights).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from clbench.errors import UserError

FIX = "copy the run's model folder again from where it was made, or save it again with this clbench"


class _Record(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class FrozenBase(_Record):
    """The weights left out because they were never trained, rebuilt from the config on load."""

    names: list[StrictStr]
    digest: StrictStr | None


class Manifest(_Record):
    """``model.json`` of format 1 (``format`` is checked first, with its own message)."""

    experiences_trained: Annotated[int, Field(ge=0)]
    config: dict[str, Any]
    config_hash: StrictStr
    strategy: dict[str, Any]
    frozen_base: FrozenBase
    tied: dict[StrictStr, StrictStr]
    stream: dict[str, Any] | None = None  # checked by clbench.data.description.read; absent before it was saved


def read_manifest(path: Path, fmt: int) -> dict:
    """``model.json`` parsed and checked; bounded in size and nesting as any received file."""
    from clbench.config.validation import Invalid, check_value
    from clbench.received import read_json

    manifest = read_json(path, fix=FIX)
    if not isinstance(manifest, dict) or manifest.get("format") != fmt:
        raise UserError(f"not a clbench model of format {fmt}", where=str(path), fix="save it again with this clbench")
    try:
        check_value(manifest, Manifest)
    except Invalid as err:
        what = "is missing" if err.what.startswith("missing '") else err.what
        raise UserError(what, where=f"{path}: {err.path.removeprefix('.')}", fix=FIX) from None
    return manifest


def check_stage(stage: int, stages: int, path: Path) -> None:
    """``experiences_trained`` within what the config trains (0 to ``stages``)."""
    if stage > stages:
        raise UserError(f"is {stage}, but its config trains {stages} experience(s) (0 to {stages})",
                        where=f"{path}: experiences_trained", fix=FIX)


def load_tensors(path: Path) -> dict:
    """The tensors of a safetensors file, or one line saying why it is not one."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from clbench.received import check_regular

    check_regular(path, fix=FIX)  # a pipe would block, a device be read without end
    try:
        return load_file(str(path))
    except SafetensorError as err:
        raise UserError(f"not a readable safetensors file: {str(err).splitlines()[0]}", where=str(path),
                        fix=FIX) from None
    except OSError as err:
        raise UserError(f"cannot read: {err.strerror or err}", where=str(path), fix=FIX) from None


def strategy_state(manifest: dict, tensors: dict, path: Path, tensors_path: Path) -> Any:
    """``model.json``'s ``strategy`` with its tensors put back from ``strategy.safetensors``."""
    from clbench.engine.saved import decode

    try:
        return decode(manifest["strategy"], tensors)
    except KeyError as err:
        raise UserError(f"names the tensor {err.args[0]!r}, which {tensors_path.name} does not hold",
                        where=f"{path}: strategy", fix=FIX) from None
    except (TypeError, ValueError, AttributeError, RecursionError) as err:
        raise UserError(f"not a saved strategy state ({type(err).__name__}: {err})",
                        where=f"{path}: strategy", fix=FIX) from None


def _kind(dtype) -> str:
    import torch

    if dtype == torch.bool:
        return "bool"
    return "complex" if dtype.is_complex else "floating-point" if dtype.is_floating_point else "integer"


def model_weights(model, manifest: dict, path: Path, weights_path: Path) -> dict:
    """The state ``model.safetensors`` gives the rebuilt ``model``: its tied weights put back,
    each tensor of the model's shape and kind of number, the frozen base's names its parameters."""
    state = load_tensors(weights_path)
    for alias, key in manifest["tied"].items():
        if key not in state:
            raise UserError(f"ties '{alias}' to '{key}', which {weights_path.name} does not hold",
                            where=f"{path}: tied", fix=FIX)
        state[alias] = state[key]
    current = model.state_dict()
    for key, tensor in state.items():
        if key not in current:
            continue  # load_state_dict reports it, as a name the model does not have
        if tuple(current[key].shape) != tuple(tensor.shape):
            raise UserError(f"the saved '{key}' has shape {tuple(tensor.shape)}, the rebuilt model's "
                            f"{tuple(current[key].shape)}", where=str(path),
                            fix="the strategy must re-create its changes to the model in adapt_model()")
        if _kind(current[key].dtype) != _kind(tensor.dtype):
            raise UserError(f"'{key}' holds {tensor.dtype} ({_kind(tensor.dtype)} numbers), the rebuilt "
                            f"model's is {current[key].dtype}", where=str(weights_path), fix=FIX)
    parameters = dict(model.named_parameters(remove_duplicate=False))
    unknown = [name for name in manifest["frozen_base"]["names"] if name not in parameters]
    if unknown:
        raise UserError(f"names '{unknown[0]}', which is not a parameter of the rebuilt model",
                        where=f"{path}: frozen_base.names", fix=FIX)
    return state
