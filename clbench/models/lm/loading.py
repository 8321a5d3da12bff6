"""Reading a causal LM and its tokenizer from disk: where they are, and what a failed load says.

A run downloads nothing. A model or tokenizer is a local folder (as ``save_pretrained`` or
``hf download`` writes it), a hub id already in the local Hugging Face cache, or a tokenizer
shipped with clbench (:data:`EMBEDDED_TOKENIZERS`); anything else, and a folder that is
incomplete or truncated, is one line naming the config field and how to fetch the files.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from clbench.config.validation import ArgumentError
from clbench.quiet import no_progress_bars

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def flash_guard(build: Callable[[], Any]) -> Any:
    """transformers' own flash-attn check (e.g. a version it refuses) as a one-line error."""
    try:
        return build()
    except ImportError as err:
        raise ArgumentError("model", "attn_implementation", str(err).splitlines()[0],
                            fix="use attn_implementation: sdpa") from None


def download_fix(name: str, field: str, folder: str | None = None) -> str:
    """How to fetch a missing model ourselves: the ``hf download`` line, and where to point ``field``."""
    target = folder or f"models/{name.rstrip('/').split('/')[-1]}"
    repo = name if folder is None else "<org>/<model>"
    return (f"clbench downloads nothing; download it first with `hf download {repo} --local-dir {target}` "
            f"or `huggingface-cli download`, then set {field} to that local folder")


def locate(name: str, field: str) -> str:
    """A local folder (absolute) or a hub id to look up in the local cache only."""
    if name in EMBEDDED_TOKENIZERS and field == "tokenizer":
        return str(EMBEDDED_TOKENIZERS[name]())
    local = Path(name).expanduser()
    if local.is_dir():
        return str(local.resolve())
    if local.exists():
        raise ArgumentError("model", field, f"{name} is a file, not a model folder",
                            fix="give the folder that holds config.json")
    if _HUB_ID.match(name) and not name.startswith("."):
        return name  # a hub id: from_disk turns a cache miss into the download hint
    raise ArgumentError("model", field, f"folder {name} does not exist", fix=download_fix(name, field, folder=name))


def _trace_mini_tokenizer() -> Path:
    from importlib.resources import files

    return Path(str(files("clbench.benchmarks") / "assets" / "trace-mini-tokenizer"))


#: Tokenizers shipped with clbench, by name (``tokenizer: trace-mini``).
EMBEDDED_TOKENIZERS: dict[str, Callable[[], Path]] = {"trace-mini": _trace_mini_tokenizer}


def from_disk(load: Callable[[], Any], name: str, field: str) -> Any:
    """Run a ``local_files_only`` load; a missing, incomplete or truncated model is a one-line UserError."""
    from safetensors import SafetensorError

    try:
        with no_progress_bars():
            return flash_guard(load)
    except (OSError, ValueError, SafetensorError) as err:
        if Path(name).expanduser().is_dir():
            detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ArgumentError("model", field, f"cannot load from {name}: {detail}",
                                fix="the folder must hold config.json and the weights (*.safetensors), "
                                    "as save_pretrained or `hf download` writes them") from None
        raise ArgumentError("model", field, f"'{name}' is not a local folder and not in the local Hugging Face cache",
                            fix=download_fix(name, field)) from None


def load_tokenizer(name: str, field: str) -> Any:
    """The tokenizer at ``name`` (a folder, a cached hub id or an embedded name), with a pad token."""
    from transformers import AutoTokenizer

    location = locate(name, field)
    if Path(location).is_dir() and not any((Path(location) / f).is_file() for f in TOKENIZER_FILES):
        raise ArgumentError("model", field, f"{name} holds no tokenizer ({', '.join(TOKENIZER_FILES)})",
                            fix="point tokenizer at the folder the tokenizer was saved to")
    tok = from_disk(lambda: AutoTokenizer.from_pretrained(location, local_files_only=True), name, field)
    if tok.pad_token is None:
        # Batches need a pad id; padded positions are masked (attention_mask, labels -100), so
        # reusing eos changes nothing the model sees, as is usual for base LMs without one.
        if tok.eos_token is None:
            raise ArgumentError("model", field, f"the tokenizer in {name} has neither a pad nor an eos token",
                                fix="use a tokenizer with an eos token")
        tok.pad_token = tok.eos_token
    return tok
