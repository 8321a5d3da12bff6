"""Checkpoints between experiences: what they hold, how they are checked, how they restore.

A checkpoint is written after every experience (atomically: a crash leaves the previous one)
and holds the model's weights (less a frozen base, see :class:`FrozenBase`), the strategy's state, the run state (R rows so far, timings),
the global RNG states, the Trainer's loop counters and the config. It is a ``torch.save``
file that loads with ``weights_only=True``, so it never runs code when read.

Integrity: ``digest`` is a SHA-256 over every tensor's dtype, shape and bytes and every other
value of the payload, stored in the payload and recomputed on load. Bytes damaged on disk
(a bad sector, a copy cut short inside a tensor) are refused instead of resuming from wrong
weights; the file's zip container checks only its own structure, not tensor contents.
"""

from __future__ import annotations

import collections
import hashlib
import json
from pathlib import Path
from typing import Any

from clbench.config.load import NON_SEMANTIC, canonical_json, config_hash
from clbench.errors import UserError

CHECKPOINT = "checkpoint.pt"
# Version of the checkpoint layout; a checkpoint of another version is refused, not misread.
SCHEMA = 3
_REQUIRED = ("config_json", "model", "frozen_base", "strategy", "rng", "loop", "epoch", "state", "digest")

# Types ``torch.load(weights_only=True)`` reads back (besides tensors and containers).
_SAFE_LEAVES = (int, float, bool, str, bytes, bytearray, complex, type(None))


def unsafe_path(value: Any, path: str = "") -> str | None:
    """The first place in ``value`` holding something a weights-only load would refuse."""
    import torch

    kind = type(value)
    if kind in _SAFE_LEAVES or kind in (torch.Tensor, torch.nn.Parameter, torch.Size, torch.device, torch.dtype):
        return None
    if kind in (dict, collections.OrderedDict, collections.Counter):
        for key, item in value.items():
            sub = f"{path}.{key}" if path else str(key)
            found = unsafe_path(key, sub + " (key)") or unsafe_path(item, sub)
            if found:
                return found
        return None
    if kind in (list, tuple, set):
        for i, item in enumerate(value):
            found = unsafe_path(item, f"{path}[{i}]")
            if found:
                return found
        return None
    return f"{path or '<root>'} ({kind.__module__}.{kind.__qualname__})"


def digest(value: Any) -> str:
    """SHA-256 of a payload's contents (tensors by dtype, shape and bytes), order-stable."""
    import torch

    from clbench.models.sharded import full

    h = hashlib.sha256()

    def walk(node: Any) -> None:
        if isinstance(node, torch.Tensor):
            t = full(node.detach()).cpu().contiguous()  # sharded: gathered (every rank walks alike)
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(node, dict):
            h.update(b"{")
            for key in node:  # insertion order: the same payload is written and read in one order
                h.update(repr(key).encode())
                walk(node[key])
            h.update(b"}")
        elif isinstance(node, (list, tuple, set)):
            h.update(b"[")
            for item in (sorted(node, key=repr) if isinstance(node, set) else node):
                walk(item)
            h.update(b"]")
        else:
            h.update(repr(node).encode())

    walk(value)
    return h.hexdigest()


def rng_states() -> dict:
    """Python, numpy, torch (and CUDA) global generator states, as tensors and plain values."""
    import random

    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": {"version": version, "state": list(internal), "gauss": gauss},
            "numpy": {"kind": kind, "keys": [int(k) for k in keys], "pos": int(pos), "has_gauss": int(has_gauss),
                      "cached": float(cached)},
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized()
            else []}


def set_rng_states(rng: dict) -> None:
    import random

    import numpy as np
    import torch

    py = rng["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    npy = rng["numpy"]
    np.random.set_state((npy["kind"], np.asarray(npy["keys"], dtype=np.uint32), npy["pos"], npy["has_gauss"],
                         npy["cached"]))
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(rng["cuda"])


def restore_loop(trainer, state: dict) -> None:
    """Put the Trainer's epoch and step counters where the checkpointed one left them.

    A checkpoint is taken between two ``fit`` calls, never inside an epoch, so the loops must
    then behave as the uninterrupted Trainer's would at that point, not as Lightning's
    mid-epoch restart: the restart flags that ``load_state_dict`` raises are cleared.
    """
    from clbench.engine.lightning_internals import clear_restart_flags

    trainer.fit_loop.load_state_dict(state)
    clear_restart_flags(trainer)


class FrozenBase:
    """The model's parameters that no step can have changed: those present when it was built
    that have never required gradients since (a frozen LLM base under LoRA-style strategies).

    Checkpoints leave them out and store their digest instead; a resume rebuilds the model from
    the config (the same local weights, or the same seeded initialisation), checks the digest,
    and loads the rest on top. So a stage checkpoint of a frozen 0.6B-parameter base holds the
    adapters and strategy state only. Parameters are followed by identity, not by name, since
    adapter injection renames the layers it wraps. A run whose base is trained (full
    fine-tuning) has no frozen part and checkpoints every weight, as before.
    """

    def __init__(self, model) -> None:
        self.model = model
        self.built = {id(p) for p in model.parameters()}
        self.trained: set[int] = set()
        self._digests: dict[tuple[str, ...], str] = {}

    def before_sharding(self) -> None:
        """Hash the frozen weights while they are whole on every rank (no gathering needed)."""
        self.digest(self.names())

    def after_sharding(self, moved: dict) -> None:
        """Follow the parameters sharding replaced (``{id(old): new}``)."""
        self.built = {id(moved[i]) if i in moved else i for i in self.built}
        self.trained = {id(moved[i]) if i in moved else i for i in self.trained}

    def observe(self) -> None:
        """Note what requires gradients now (called before every experience trains)."""
        self.trained |= {id(p) for p in self.model.parameters() if p.requires_grad}

    def names(self) -> list[str]:
        self.observe()
        return [name for name, p in self.model.named_parameters(remove_duplicate=False)
                if id(p) in self.built and id(p) not in self.trained]

    def restore_trained(self, names: set[str]) -> None:
        """After a resume: the parameters the checkpointed process had seen trained."""
        self.trained |= {id(p) for name, p in self.model.named_parameters(remove_duplicate=False) if name in names}

    def digest(self, names: list[str]) -> str:
        """Of the named frozen weights; computed once per set (they cannot change), not at every
        stage's checkpoint (a 0.6B base is over a gigabyte to hash)."""
        key = tuple(names)
        if key not in self._digests:
            values = dict(self.model.named_parameters(remove_duplicate=False))
            self._digests[key] = digest({name: values[name] for name in names})
        return self._digests[key]


def run_settings(precision: str | None = None) -> dict:
    """What is set outside the config that changes a CPU run's numbers: the torch thread count
    (``--threads``; the order of floating-point reductions depends on it), the CPU kernel level it
    pinned (``--cpu-kernels``, :mod:`clbench.cpu_kernels`; None: unpinned), and the Trainer's
    precision where the machine chose it (:mod:`clbench.engine.precision`; a resume keeps it)."""
    import torch

    from clbench.cpu_kernels import pinned_level

    return {"torch_threads": torch.get_num_threads(), "cpu_kernels": pinned_level(),
            **({"precision": precision} if precision else {})}


def check_settings(ckpt: dict, path: Path) -> None:
    """Refuse a resume under other run settings than the checkpointed process's: the result
    records one value, so half a run made under another would be recorded wrongly. A checkpoint
    from before settings were recorded is not checked."""
    saved, current = ckpt.get("settings"), run_settings()
    if not isinstance(saved, dict):
        return
    before, now = saved.get("torch_threads"), current["torch_threads"]
    if before is not None and before != now:
        raise UserError(f"the run in {path.parent} was started with {before} torch thread(s), this resume would "
                        f"use {now} (CPU results depend on the thread count)", where="--threads",
                        fix=f"resume with --threads {before}, or start again with --overwrite")
    if "cpu_kernels" in saved and saved["cpu_kernels"] != current["cpu_kernels"]:
        before, now = saved["cpu_kernels"] or "native", current["cpu_kernels"] or "native"
        raise UserError(f"the run in {path.parent} was started with CPU kernels {before}, this resume would use "
                        f"{now} (CPU results depend on the kernels' instruction set)", where="--cpu-kernels",
                        fix=f"resume with --cpu-kernels {before}, or start again with --overwrite")


def payload(cfg: dict, module, strategy, trainer, state: dict, source: str, base: FrozenBase | None = None) -> dict:
    """The checkpoint's contents, checked storable and sealed with its digest. With sharded
    parameters every rank must call this (it gathers them); only global rank 0's is complete."""
    from clbench.engine.sharding import model_state

    weights = model_state(module.model)
    frozen: dict[str, Any] = {"names": [], "digest": None, "trained": []}
    if base is not None:
        names = base.names()
        if names:
            frozen = {"names": names, "digest": base.digest(names),
                      "trained": [n for n, p in module.model.named_parameters() if id(p) in base.trained]}
            weights = {k: v for k, v in weights.items() if k not in set(names)}
    out = {"schema": SCHEMA, "config_json": canonical_json(cfg), "config_hash": config_hash(cfg),
           "settings": run_settings(trainer.precision),
           "model": weights, "frozen_base": frozen, "strategy": strategy.state_dict(), "rng": rng_states(),
           "loop": trainer.fit_loop.state_dict(), "epoch": trainer.current_epoch, "state": state}
    unsafe = unsafe_path(out["strategy"])
    if unsafe:
        raise UserError(f"strategy state holds a value a checkpoint cannot store at {unsafe}",
                        where=f"{source}: strategy",
                        fix="return only tensors and plain Python values (int, float, str, list, dict) "
                            "from the strategy's state_dict")
    unsafe = unsafe_path(out)
    if unsafe:
        raise TypeError(f"checkpoint holds an unstorable value at {unsafe}")
    out["digest"] = digest(out)
    return out


def _damage(err: BaseException) -> str:
    """What a failed load says about the file, in words (not the unpickler's internals)."""
    text = str(err).lower()
    if isinstance(err, EOFError) or "central directory" in text or "truncated" in text or "unexpected eof" in text:
        return "it is truncated (an interrupted write or copy)"
    return "its contents are scrambled or it is not a clbench checkpoint"


def read(path: Path, cfg: dict, source: str) -> dict:
    """The checkpoint at ``path``, refused (before anything is built) if it is damaged or its
    config differs from ``cfg`` in anything that changes results."""
    import torch

    fix = "delete the output directory and rerun without --resume"
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a damaged file fails in many ways inside the unpickler
        raise UserError(f"cannot read checkpoint {path}: {_damage(err)}", where="--resume", fix=fix) from None
    schema = ckpt.get("schema") if isinstance(ckpt, dict) else None
    if schema != SCHEMA:
        raise UserError(f"checkpoint {path} has format {schema}, this clbench writes {SCHEMA}",
                        where="--resume", fix="rerun without --resume (with --overwrite) to start again")
    missing = [k for k in _REQUIRED if k not in ckpt]
    if missing:
        raise UserError(f"checkpoint {path} lacks {', '.join(missing)}", where="--resume",
                        fix="rerun without --resume (with --overwrite) to start again")
    stored = ckpt.pop("digest")
    if digest(ckpt) != stored:
        raise UserError(f"checkpoint {path} fails its checksum: its contents changed after it was written "
                        "(disk or copy damage)", where="--resume", fix=fix)
    check_settings(ckpt, path)
    saved = json.loads(ckpt["config_json"])
    current = json.loads(canonical_json(cfg))
    differing = [k for k in _diff_keys(saved, current) if k.split(".")[0] not in NON_SEMANTIC]
    if differing:
        shown = "; ".join(f"{k}: checkpoint {_lookup(saved, k)!r}, now {_lookup(current, k)!r}"
                          for k in differing[:4])
        more = f" and {len(differing) - 4} more" if len(differing) > 4 else ""
        raise UserError(f"config differs from the checkpoint's at {', '.join(differing)} ({shown}{more})",
                        where=source,
                        fix="resume with the config the run started with, or start a new run in another --output")
    return ckpt


def restore(ckpt: dict, module, strategy, trainer, base: FrozenBase | None = None) -> dict:
    """Strategy, model structure and weights, trainer counters and RNG states as they were.

    The strategy's state first, then its structural changes to the model (layers it added,
    shapes it grew: ``adapt_model`` replayed up to the experiences the checkpoint finished, and
    under sharded parameters everything the run will need, as the checkpointed process had),
    then the weights, which need those shapes. A frozen base left out of the checkpoint must be
    the rebuilt model's, bit for bit.
    """
    from clbench.engine.trainer import shards_parameters

    strategy.load_state_dict(ckpt["strategy"])
    strategy.adapt_model(module.context, ckpt["state"]["stage"])
    if shards_parameters(trainer):
        module.adapt_for_sharding()
    current = {k: tuple(v.shape) for k, v in module.model.state_dict().items()}
    for key, tensor in ckpt["model"].items():
        if key in current and current[key] != tuple(tensor.shape):
            raise UserError(f"the checkpoint's '{key}' has shape {tuple(tensor.shape)}, the rebuilt model's "
                            f"{current[key]}", where="--resume",
                            fix="the strategy must re-create its changes to the model in adapt_model()")
    frozen = ckpt["frozen_base"]
    if frozen["names"]:
        present = dict(module.model.named_parameters(remove_duplicate=False))
        lost = [n for n in frozen["names"] if n not in present]
        if lost or base is None or base.digest(frozen["names"]) != frozen["digest"]:
            raise UserError("the base model's frozen weights differ from those the run started with"
                            + (f" ({lost[0]} is gone)" if lost else ""), where="--resume",
                            fix="resume with the same base checkpoint (model.init_args.path), or start again")
        base.restore_trained(set(frozen["trained"]))
        missing = set(module.model.load_state_dict(ckpt["model"], strict=False).missing_keys) - set(frozen["names"])
        if missing:
            raise UserError(f"the checkpoint lacks the weight '{sorted(missing)[0]}'", where="--resume",
                            fix="delete the output directory and rerun without --resume")
    else:
        module.model.load_state_dict(ckpt["model"])
    restore_loop(trainer, ckpt["loop"])
    set_rng_states(ckpt["rng"])
    return ckpt["state"]


def _diff_keys(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            out += _diff_keys(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [] if a == b else [prefix or "<root>"]


def _lookup(cfg: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        cfg = cfg.get(key) if isinstance(cfg, dict) else None
    return cfg
