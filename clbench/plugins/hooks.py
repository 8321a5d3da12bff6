"""A strategy plugin's hooks that misbehave, reported at the plugin's own line with the hook's contract.

Three kinds of failure, each one line naming the file and line of the plugin's code:

* a hook the harness cannot call as it does (wrong number of arguments): checked once, when the
  strategy class is resolved (:func:`check_signatures`), before anything is built;
* a hook that raises, anywhere in the run: :func:`failure` translates the exception where the run
  ends (``ContinualRun.execute``), so no call site wraps its hook;
* a hook that returns what the engine cannot use (``prepare_batch`` not a pair, ``training_loss``
  or ``update`` not a tensor): the training step checks the value's type (cheap: no inspection on
  the hot path) and raises :func:`returned`; ``hparams()`` and ``diagnostics()``, which go into
  result.json, are encoded as the result is after the first stage (:func:`check_json`), not
  after the whole run.
"""

from __future__ import annotations

import inspect
import json
import traceback
from pathlib import Path
from typing import Any

from clbench.errors import UserError
from clbench.registry import shown_path

#: What each hook gives back; its arguments are read from :class:`clbench.strategy.Strategy`.
RETURNS: dict[str, str] = {
    "setup": "None", "adapt_model": "None", "before_experience": "None",
    "train_dataset": "a Dataset", "train_loader": "an iterable of batches (or a CombinedLoader)",
    "prepare_batch": "(inputs, targets)", "training_loss": "the loss as a torch.Tensor",
    "update": "the step's (detached) loss as a torch.Tensor", "after_backward": "None",
    "before_optimizer_step": "None", "after_optimizer_step": "None", "evaluating": "a context manager",
    "after_experience": "None", "state_dict": "a dict of tensors and plain values", "load_state_dict": "None",
    "hparams": "a dict JSON can write", "diagnostics": "a dict JSON can write",
}

FIX = "see docs/strategies.md, 'Writing a strategy'"


def _base_parameters(hook: str) -> list[str]:
    from clbench.strategy import Strategy

    return list(inspect.signature(getattr(Strategy, hook)).parameters)[1:]


def contract(hook: str) -> str:
    """``prepare_batch(ctx, batch) -> (inputs, targets)``: how the harness calls ``hook``."""
    return f"{hook}({', '.join(_base_parameters(hook))}) -> {RETURNS[hook]}"


def defined_at(cls: type, hook: str) -> str:
    """``mine.py:12``: where ``cls``'s own ``hook`` is defined (the class's file when inherited)."""
    fn = inspect.getattr_static(cls, hook, None)
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is not None:
        return f"{shown_path(code.co_filename)}:{code.co_firstlineno}"
    try:
        return shown_path(inspect.getsourcefile(cls) or cls.__module__)
    except TypeError:
        return cls.__module__


def _overrides(cls: type) -> list[str]:
    from clbench.strategy import Strategy

    return [hook for hook in RETURNS if getattr(cls, hook, None) is not getattr(Strategy, hook)]


def check_signatures(cls: type, where: str) -> None:
    """Refuse a hook that cannot take the arguments the harness passes it (all positional)."""
    for hook in _overrides(cls):
        fn = getattr(cls, hook)
        if not callable(fn):
            raise UserError(f"{defined_at(cls, hook)}: {cls.__qualname__}.{hook} is a {type(fn).__name__}, "
                            f"not a method", where=where, fix=f"define it as {contract(hook)} ({FIX})")
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin: nothing to check
            continue
        try:
            signature.bind(None, *([None] * len(_base_parameters(hook))))
        except TypeError:
            raise UserError(f"{defined_at(cls, hook)}: {cls.__qualname__}.{hook}{signature} cannot take the "
                            f"arguments the harness passes: {contract(hook)}", where=where,
                            fix=f"give it that signature ({FIX})") from None


def returned(strategy: Any, hook: str, value: Any) -> UserError:
    """The error for ``hook`` returning ``value``, which its contract does not allow."""
    cls = type(strategy)
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    err = UserError(f"{defined_at(cls, hook)}: {cls.__qualname__}.{hook}() returned {type(value).__name__} "
                    f"{shown}; the harness calls {contract(hook)}", fix=f"return {RETURNS[hook]} ({FIX})")
    err.hook_contract = True  # the run names its config file (failure())
    return err


def _plugin_file(cls: type) -> Path | None:
    from clbench import registry

    if not registry.is_plugin(cls):
        return None
    try:
        path = inspect.getsourcefile(cls)
    except TypeError:
        return None
    return Path(path).resolve() if path else None


def failure(err: BaseException, strategy: Any, source: str) -> UserError | None:
    """``err``, raised from a plugin strategy's own code during the run from config ``source``,
    as one line at its line with the contract of the hook it was raised in (a :func:`returned`
    error gets the config file); None for anything else (the harness's bugs keep their
    traceback, other bad input is already a UserError, Ctrl-C stays an interrupt)."""
    where = f"{source}: strategy"
    if isinstance(err, UserError) and getattr(err, "hook_contract", False) and err.where is None:
        err.where = where
        err.args = (err.one_line(),)
        return err
    if strategy is None or isinstance(err, (UserError, KeyboardInterrupt)) \
            or not isinstance(err, (Exception, SystemExit)):
        return None
    cls = type(strategy)
    path = _plugin_file(cls)
    if path is None:
        return None
    frames = [f for f in traceback.extract_tb(err.__traceback__) if Path(f.filename).resolve() == path]
    if not frames:
        return None
    hook = frames[0].name  # the outermost frame in the plugin: the hook the harness called
    doing = (f"running {cls.__qualname__}.{hook}(), called as {contract(hook)}" if hook in RETURNS
             else f"running {cls.__qualname__}'s {hook}()")
    from clbench.registry import plugin_failure

    return plugin_failure(err, where=where, doing=doing, path=path)


def _unencodable(value: Any, at: str) -> tuple[str, str] | None:
    """The first place in ``value`` that strict JSON cannot hold, and why (None: none)."""
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if value == value and abs(value) != float("inf") else (at, f"is {value}, which strict JSON has no number for")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{at}[{key!r}]", f"has a key of type {type(key).__name__}, and JSON keys are strings"
            found = _unencodable(item, f"{at}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _unencodable(item, f"{at}[{i}]")
            if found:
                return found
        return None
    return at, f"is a {type(value).__module__}.{type(value).__qualname__}, which JSON cannot write"


def check_json(strategy: Any, where: str) -> None:
    """Encode ``hparams()`` and ``diagnostics()`` as result.json will (:func:`clbench.io.json_text`),
    so a value JSON cannot write fails now, naming its key, rather than after the whole run."""
    from clbench.io import json_text

    cls = type(strategy)
    for hook in ("hparams", "diagnostics"):
        value = getattr(strategy, hook)()
        try:
            json.loads(json_text(value))
            if isinstance(value, dict):
                continue
            found = ("", f"is {type(value).__name__}, not a dict")
        except (TypeError, ValueError, RecursionError):
            found = _unencodable(value, "") or ("", "cannot be written as JSON")
        at, why = found
        raise UserError(f"{defined_at(cls, hook)}: {cls.__qualname__}.{hook}(){at} {why}", where=where,
                        fix=f"return {RETURNS[hook]}: numbers, strings, lists and dicts with string keys "
                            f"(e.g. tensor.tolist()) ({FIX})")


__all__ = ["RETURNS", "check_json", "check_signatures", "contract", "defined_at", "failure", "returned"]
