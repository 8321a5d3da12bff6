"""Causal language models from transformers, built by name from a config.

``hf_causal_lm`` is the model builder (``model.class_path: hf_causal_lm``). It builds either

- a pretrained model from ``path``: a local folder written by ``save_pretrained`` (or by
  ``hf download``), a hub id already in the local Hugging Face cache, or a GGUF file or preset
  name, converted once into such a folder (:mod:`clbench.models.lm.gguf`). A run
  downloads nothing, so it never stalls on, or silently depends on, the network; or
- a random initialisation of a named ``architecture`` (``qwen3``, ``llama``, any model type
  transformers has a causal LM for) with ``config`` overrides, for tests and speed work, with
  the tokenizer from the folder ``tokenizer``.

The result is a :class:`CausalLM`: a thin ``nn.Module`` around the transformers model, so the
engine, strategies (peft adapters included) and checkpoints see the plain model under ``hf.``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import torch
from pydantic import Field
from torch import nn
from typing_extensions import TypedDict

from clbench.errors import UserError, did_you_mean
from clbench.config.validation import ArgumentError, mapping_argument
from clbench.models.lm.loading import flash_guard, from_disk, load_tokenizer, locate

DType = Literal["float32", "bfloat16", "float16"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}  # DType's names
Attention = Literal["sdpa", "eager", "flash_attention_2"]
ATTENTION = get_args(Attention)
Location = Annotated[str, Field(min_length=1)]  # a local folder, a hub id in the cache, a GGUF file or preset
LORA_DEFAULTS = {"r": 8, "alpha": 16.0}  # the ``lora`` model argument's rank and α when not given


@mapping_argument
class LoRASettings(TypedDict, total=False):
    """``lora: {r: 8, alpha: 16, dropout: 0.0, target_modules: [q_proj, v_proj]}`` (these are the defaults)."""

    r: Annotated[int, Field(ge=1)]
    alpha: Annotated[float, Field(gt=0)]
    dropout: Annotated[float, Field(ge=0, lt=1)]
    target_modules: Annotated[list[str], Field(min_length=1)]


class CausalLM(nn.Module):
    """A transformers causal LM (``.hf``) with its tokenizer (``.tokenizer``).

    ``forward`` and ``generate`` pass straight through, so a batch from the causal-LM collator
    (``input_ids``, ``attention_mask``, ``labels``) gives the transformers output (``.loss``,
    ``.logits``). The state dict is the transformers model's under the prefix ``hf.``: a
    checkpoint is plain weights, and ``hf.save_pretrained`` exports them for any tool.

    The tokenizer keeps its own padding side (right, for training). Generation needs left
    padding so that every prompt ends where decoding starts; the causal-LM objective's
    evaluation collator asks for it per call (``padding_side="left"``), nothing here changes it.
    """

    def __init__(self, hf: nn.Module, tokenizer: Any, source: dict | None = None):
        super().__init__()
        self.hf = hf
        self.tokenizer = tokenizer
        self.source = dict(source or {})  # how it was built: path or architecture, for records

    def forward(self, *args: Any, **batch: Any) -> Any:
        return self.hf(*args, **batch)

    def generate(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``transformers`` generation (greedy unless told otherwise); pad/eos ids are preset."""
        return self.hf.generate(*args, **kwargs)

    @property
    def config(self) -> Any:
        return self.hf.config

    @property
    def vocab_size(self) -> int:
        """Width of the logits (the output embedding's rows; may exceed ``len(tokenizer)``)."""
        return self.hf.get_output_embeddings().weight.shape[0]

    @property
    def gradient_checkpointing(self) -> bool:
        return _checkpointing_on(self.hf)

    def parameter_counts(self) -> dict[str, int]:
        return parameter_counts(self)

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """Write the model and its tokenizer so that ``hf_causal_lm(path=out_dir)`` loads them."""
        out = Path(out_dir)
        self.hf.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        return out


def parameter_counts(module: nn.Module) -> dict[str, int]:
    """``{"total": ..., "trainable": ...}``; tied weights (shared embeddings) count once."""
    total = trainable = 0
    for p in module.parameters():  # parameters() yields a shared tensor once
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return {"total": total, "trainable": trainable}


def hf_causal_lm(path: Location | None = None, architecture: str | None = None, config: dict[str, Any] | None = None,
                 tokenizer: Location | None = None, gguf_file: str | None = None, dtype: DType = "float32",
                 attn_implementation: Attention = "sdpa", gradient_checkpointing: bool = False,
                 lora: LoRASettings | None = None) -> CausalLM:
    """Build a causal LM: pretrained from ``path``, or randomly initialised from ``architecture``.

    ``path`` is a local folder, a hub id in the local cache, a GGUF file (``x.gguf``, or the
    folder with ``gguf_file: x.gguf``) or a preset name (``smollm2-135m-instruct``, fetched
    once with ``clbench models fetch``); GGUF weights are dequantised once into a cached
    safetensors folder (:mod:`clbench.models.lm.gguf`) that later runs load directly.

    ``config`` overrides fields of the model's configuration (with ``path``: of its
    config.json; with ``architecture``: of that architecture's defaults, which describe a large
    model, so give the sizes). ``tokenizer`` is a local folder; with ``path`` it defaults to
    ``path``, and for a random init its size sets ``vocab_size`` (a larger ``vocab_size`` in
    ``config`` is kept, e.g. to match a real model's embedding). ``dtype`` is the parameters'
    dtype; ``attn_implementation`` is transformers' (``flash_attention_2`` needs flash-attn,
    CUDA and a 16-bit dtype). Gradient checkpointing recomputes activations in the backward
    pass (non-reentrant, so frozen bases with adapters work).

    ``lora`` (``{r, alpha, dropout, target_modules}``) injects one LoRA adapter with peft and
    freezes everything else, so that any strategy (EWC, GEM, replay, plain sequential training)
    runs on the adapter's parameters only: "EWC on LoRA" is the ``ewc`` strategy on such a model.
    """
    from transformers import AutoModelForCausalLM

    torch_dtype = DTYPES[dtype]
    _check_attention(attn_implementation, dtype)
    overrides = dict(config or {})
    if (path is None) == (architecture is None):
        raise ArgumentError("model", "", "give exactly one of path (pretrained weights) and architecture (random init)",
                            fix="set path: <local model folder>, or architecture: qwen3 with a config")
    if gguf_file is not None and path is None:
        raise ArgumentError("model", "gguf_file", "gguf_file names a file inside the folder given as path",
                            fix="set path: <folder holding the .gguf file>, or path: <file.gguf> alone")
    if architecture is not None and tokenizer is None:
        raise ArgumentError("model", "tokenizer", "a random initialisation needs a tokenizer (its size sets "
                            "vocab_size)", fix="set tokenizer: <local tokenizer folder>")
    packaged = None
    if path is not None:
        from clbench.models.lm import gguf

        path, packaged = gguf.resolve(path, gguf_file)
        location = locate(path, "path")
        tok = load_tokenizer(tokenizer if tokenizer is not None else path,
                             "tokenizer" if tokenizer is not None else "path")
        cfg = from_disk(lambda: _pretrained_config(location, overrides), path, "path")
        hf = from_disk(lambda: AutoModelForCausalLM.from_pretrained(
            location, config=cfg, dtype=torch_dtype, attn_implementation=attn_implementation,
            local_files_only=True), path, "path")
        if len(tok) > hf.get_input_embeddings().weight.shape[0]:
            raise ArgumentError("model", "tokenizer", f"the tokenizer has {len(tok)} tokens but the model's embedding "
                                f"has {hf.get_input_embeddings().weight.shape[0]} rows",
                                fix="use the tokenizer saved with these weights")
        source = {"path": str(location), **(packaged or {})}
        # from_pretrained returns the model in eval mode, and Lightning's fit does not switch
        # modes: a loaded model must train in train mode like a built one (dropout, and the
        # adapters that train differently, e.g. MoSEs' straight-through masks).
        hf.train()
    else:
        _check_architecture(architecture)
        tok = load_tokenizer(tokenizer, "tokenizer")
        cfg = _random_config(architecture, overrides, tok)
        hf = flash_guard(lambda: AutoModelForCausalLM.from_config(
            cfg, dtype=torch_dtype, attn_implementation=attn_implementation))
        source = {"architecture": architecture, "config": overrides}
    _align_special_tokens(hf, tok)
    if gradient_checkpointing:
        if not getattr(hf, "supports_gradient_checkpointing", False):
            raise ArgumentError("model", "gradient_checkpointing", f"{type(hf).__name__} does not support gradient "
                                "checkpointing", fix="set gradient_checkpointing: false")
        _enable_checkpointing(hf)
    if lora is not None:
        _inject_lora(hf, lora)
    tok_name = tokenizer if tokenizer is not None else path
    tok_at = str(Path(tok_name).expanduser().resolve()) if Path(tok_name).expanduser().is_dir() else tok_name
    return CausalLM(hf, tok, source={**source, "tokenizer": tok_at, "dtype": dtype})


# --- arguments -------------------------------------------------------------------------------

def _check_attention(name: Attention, dtype: DType) -> None:
    """flash_attention_2 needs flash-attn, CUDA and a 16-bit dtype."""
    if name != "flash_attention_2":
        return
    why = ("flash-attn is not installed" if importlib.util.find_spec("flash_attn") is None
           else "there is no CUDA device" if not torch.cuda.is_available()
           else f"it needs bfloat16 or float16, not {dtype}" if dtype == "float32" else None)
    if why:
        raise ArgumentError("model", "attn_implementation", f"flash_attention_2 cannot be used: {why}",
                            fix="use attn_implementation: sdpa, or install flash-attn and run on a CUDA GPU in "
                                "bfloat16")


LORA_KEYS = tuple(LoRASettings.__annotations__)


def _inject_lora(hf: nn.Module, spec: LoRASettings) -> None:
    """One LoRA adapter (peft) on ``target_modules`` (default: the attention's query and value
    projections, as in the LoRA paper); only its parameters stay trainable."""
    from peft import LoraConfig, inject_adapter_in_model

    spec = {**LORA_DEFAULTS, **spec}
    config = LoraConfig(r=int(spec["r"]), lora_alpha=float(spec["alpha"]),
                        lora_dropout=float(spec.get("dropout", 0.0)),
                        target_modules=spec.get("target_modules", ["q_proj", "v_proj"]))
    try:
        inject_adapter_in_model(config, hf)
    except ValueError as err:
        raise ArgumentError("model", "lora.target_modules", f"LoRA cannot be injected: {str(err).splitlines()[0]}",
                            fix="name modules the model has (e.g. q_proj, v_proj)") from None


# --- configurations --------------------------------------------------------------------------

def _pretrained_config(location: str, overrides: dict) -> Any:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(location, local_files_only=True)
    known = known_config_keys(type(cfg))
    for key, value in overrides.items():  # from_pretrained would drop an unknown key silently
        if key not in known:
            raise _unknown_key(type(cfg), key, known)
        setattr(cfg, key, value)
    return cfg


def _check_architecture(architecture: str) -> None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if architecture not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        from rapidfuzz import process

        best = process.extractOne(str(architecture), list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), score_cutoff=60)
        hint = f"did you mean '{best[0]}'? " if best else ""
        raise ArgumentError("model", "architecture", f"'{architecture}' is not a transformers causal-LM model type",
                            fix=f"{hint}e.g. qwen3, llama, gpt2 (the model_type in a config.json)")


def _random_config(architecture: str, overrides: dict, tok: Any) -> Any:
    from transformers import AutoConfig

    vocab = overrides.get("vocab_size", len(tok))
    if not isinstance(vocab, int) or isinstance(vocab, bool):
        raise ArgumentError("model", "config.vocab_size", f"vocab_size must be an integer, got {vocab!r}")
    if vocab < len(tok):
        raise ArgumentError("model", "config.vocab_size", f"vocab_size {vocab} is smaller than the tokenizer "
                            f"({len(tok)} tokens)", fix="drop vocab_size; the tokenizer's size is used")
    ids = {f"{k}_token_id": getattr(tok, f"{k}_token_id") for k in ("pad", "bos", "eos")}
    values = {**{k: v for k, v in ids.items() if v is not None}, **overrides, "vocab_size": vocab}
    try:
        cfg = AutoConfig.for_model(architecture, **values)
    except (TypeError, ValueError) as err:
        raise ArgumentError("model", "config", f"bad {architecture} config: {str(err).splitlines()[0]}") from None
    _check_keys(type(cfg), cfg, overrides)
    return cfg


def known_config_keys(cls: type) -> set[str]:
    """Fields a configuration class takes, stores or maps (``attribute_map``)."""
    import inspect

    return set(inspect.signature(cls.__init__).parameters) | set(cls().to_dict()) | set(cls.attribute_map)


def _unknown_key(cls: type, key: str, known: set[str]) -> UserError:
    fields = sorted(k for k in known if not k.startswith("_") and k not in ("self", "kwargs"))
    return ArgumentError("model", f"config.{key}", f"{cls.model_type} configs have no field '{key}'",
                         fix=did_you_mean(key, fields))


def _check_keys(cls: type, cfg: Any, overrides: dict) -> None:
    """Refuse override keys the configuration class does not know (a typo would be ignored).

    Legacy names the class converts (``rope_theta`` into ``rope_parameters``) leave no
    attribute behind and pass; an unknown key is kept as a stray attribute and is refused.
    """
    known = known_config_keys(cls)
    for key in overrides:
        if key not in known and hasattr(cfg, key):
            raise _unknown_key(cls, key, known)


def _align_special_tokens(hf: nn.Module, tok: Any) -> None:
    """Give generation the tokenizer's pad/eos ids where the checkpoint left them unset."""
    gen = getattr(hf, "generation_config", None)
    if gen is None:
        return
    if gen.pad_token_id is None:
        gen.pad_token_id = tok.pad_token_id
    if gen.eos_token_id is None:
        gen.eos_token_id = tok.eos_token_id
    if getattr(hf.config, "pad_token_id", None) is None:
        hf.config.pad_token_id = tok.pad_token_id


# --- gradient checkpointing ------------------------------------------------------------------

def _enable_checkpointing(hf: Any) -> None:
    kwargs = {"use_reentrant": False}  # reentrant checkpoints need inputs that require grad
    if hasattr(type(hf), "activation_checkpointing_enable"):  # transformers >= 5: the new name
        hf.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _checkpointing_on(hf: Any) -> bool:
    if hasattr(type(hf), "is_activation_checkpointing"):
        return bool(hf.is_activation_checkpointing)
    return bool(getattr(hf, "is_gradient_checkpointing", False))
