"""A model's memory, checked against this machine before the model is built.

A size typed with a few zeros too many (``model.init_args.hidden=1000000000000``) would
otherwise reach the allocator after the stream was built, as its traceback, or overflow
torch's tensor sizes. :func:`check_fits` builds the model once on PyTorch's meta device
(shapes only: nothing is allocated; about a millisecond for the MLP), counts its bytes and
refuses, as one line naming ``model.init_args``, a model that cannot train here.

What is counted is a floor, so that no run that fits is refused: the parameters and buffers
(what the build allocates, on the CPU) and, where training happens, one gradient per trainable
parameter (every optimizer step needs it next to its parameter). Optimizer state is left out:
it depends on the optimizer (none for plain SGD, two copies of the parameters for Adam), as are
activations and the copies strategies keep. The CPU is compared with the memory available now;
a run that trains on a CUDA device (``trainer.accelerator`` gpu/cuda, or auto with one present)
also with that device's free memory, except under ``fsdp``, where each device holds a part.

Only the built-in factories are built on meta, and only with arguments that read nothing from
disk (:data:`META_SAFE`): a factory that loads weights (``hf_causal_lm``, timm's pretrained
weights, ``checkpoint_path``, ``weights_path``) would read or allocate for them, and a plugin's
factory may do anything (read files, print) that should happen once. Those are built as they are.
"""

from __future__ import annotations

import os
import random
import warnings
from typing import Any, Callable

from clbench.errors import UserError


def _no_hub_name(args: dict) -> bool:
    return ":" not in str(args.get("name") or "")  # hf-hub:... fetches its configuration


#: Factory (``module:name``) -> whether its meta build reads nothing from disk with these arguments.
META_SAFE: dict[str, Callable[[dict], bool]] = {
    "clbench.models.factories:mlp": lambda args: True,
    "clbench.models.factories:cnn": lambda args: True,
    "clbench.models.factories:vit": lambda args: not args.get("pretrained") and not args.get("checkpoint_path")
    and _no_hub_name(args),
    "clbench.models.vision.vit_moe:vit_moe": lambda args: not args.get("weights_path") and _no_hub_name(args),
}


def check_fits(target: Callable, init_args: dict, provided: dict, trainer: dict | None, *, where: str) -> None:
    """Refuse, as one :class:`UserError` at ``where`` (``model.init_args``), a model whose sizes
    overflow torch or whose parameters (and gradients) exceed this machine's memory."""
    safe = META_SAFE.get(f"{getattr(target, '__module__', '')}:{getattr(target, '__qualname__', '')}")
    if safe is None or not safe(init_args):
        return
    sizes = ", ".join(f"{key}={value}" for key, value in init_args.items()
                      if isinstance(value, int) and not isinstance(value, bool))
    fix = f"lower {'the sizes under model.init_args' if not sizes else sizes}"
    model = _meta_build(target, {**provided, **init_args})
    if isinstance(model, Exception):
        raise UserError("the model's sizes overflow torch's 64-bit tensor sizes", where=where, fix=fix) from None
    if model is None:
        return
    weights, grads = _bytes(model)
    device = cuda_device(trainer or {})
    on_cpu = weights + (grads if device is None else 0)
    room = available_memory()
    if room is not None and on_cpu > room:
        raise UserError(f"the model needs {_size(on_cpu)} ({_count(model)} parameters"
                        f"{'' if device is not None else ' and their gradients'}), but this machine has "
                        f"{_size(room)} of memory available", where=where, fix=fix)
    if device is not None:
        import torch

        try:
            free, _ = torch.cuda.mem_get_info(device)
        except RuntimeError:  # a device this process cannot use: Lightning reports it
            return
        if weights + grads > free:
            raise UserError(f"the model needs {_size(weights + grads)} ({_count(model)} parameters and their "
                            f"gradients), but cuda:{device} has {_size(free)} free", where=where, fix=fix)


def _meta_build(target: Callable, kwargs: dict) -> Any:
    """The model built on the meta device; the exception when its sizes overflow torch's; None
    when the meta build fails otherwise (an operation meta tensors lack): the real build decides."""
    import numpy as np
    import torch

    state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            return target(**kwargs)
    except (OverflowError, RuntimeError, TypeError, ValueError) as err:
        return err if isinstance(err, OverflowError) or "overflow" in str(err).lower() else None
    except Exception:  # noqa: BLE001 - a UserError, or whatever the real build will report itself
        return None
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])


def _bytes(model) -> tuple[int, int]:
    """Bytes of the parameters and buffers, and of the trainable parameters' gradients."""
    weights = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return weights, grads


def available_memory() -> int | None:
    """Bytes of memory this machine can give now without swapping (psutil, else /proc/meminfo)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cuda_device(trainer: dict) -> int | None:
    """The CUDA device this process will train on, from the config's ``trainer`` section; None for
    the CPU, another accelerator, or a sharded run (``fsdp``)."""
    accelerator = str(trainer.get("accelerator") or "auto").lower()
    if accelerator not in ("gpu", "cuda", "auto") or "fsdp" in str(trainer.get("strategy") or "").lower():
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    devices = trainer.get("devices")
    if isinstance(devices, str) and "," in devices:
        devices = [int(part) for part in devices.split(",") if part.strip().isdigit()]
    listed = list(devices) if isinstance(devices, (list, tuple)) else list(range(torch.cuda.device_count()))
    rank = int(os.environ.get("LOCAL_RANK", "0") or 0)  # one device per process under ddp
    return listed[rank] if rank < len(listed) else None


def _count(model) -> str:
    return f"{sum(p.numel() for p in model.parameters()):,}"


def _size(nbytes: int) -> str:
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes:,} bytes"

