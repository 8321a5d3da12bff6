"""hf_causal_lm: local checkpoints, random inits, the offline tokenizer, and one-line errors.

Everything runs offline: the tokenizer is trained here and the model written with
save_pretrained, and any attempt to open a network connection fails the test.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket

import pytest
import torch

from clbench.errors import UserError
from clbench.models.lm.fixtures import sample_texts, tiny_config, write_tiny_model
from clbench.models.lm.causal_lm import hf_causal_lm, parameter_counts
from clbench.data.tokenizer import train_tiny_tokenizer
from helpers import checked

ADDED = ["<NUM_LIT>", "<STR_LIT>"]
_attempts: list = []


@contextlib.contextmanager
def offline():
    """HF offline mode, and internet sockets that refuse to connect (and are recorded)."""
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def guard(real):
        def connect(sock, address, *args):
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                _attempts.append(address)
                raise ConnectionRefusedError(f"test is offline: connection to {address} refused")
            return real(sock, address, *args)
        return connect

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        mp.setattr(socket.socket, "connect", guard(real_connect))
        mp.setattr(socket.socket, "connect_ex", guard(real_connect_ex))
        yield


@pytest.fixture(autouse=True)
def no_network():
    _attempts.clear()
    with offline():
        yield
    assert not _attempts, f"tried to reach the network: {_attempts}"


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory):
    with offline():
        return train_tiny_tokenizer(sample_texts(), tmp_path_factory.mktemp("lm") / "tokenizer", vocab_size=320,
                                    added_tokens=ADDED)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, tok_dir):
    with offline():
        return write_tiny_model(tmp_path_factory.mktemp("lm") / "qwen3-tiny", tok_dir, "qwen3", seed=0)


def batch(model, n=8):
    tok = model.tokenizer
    enc = tok(sample_texts(n, seed=1), return_tensors="pt", padding=True)
    enc["labels"] = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    return enc


# --- the tokenizer ---------------------------------------------------------------------------

def test_tiny_tokenizer_loads_like_a_real_one_and_round_trips(tok_dir, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    assert len(tok) == 320 + len(ADDED)
    ids = {tok.pad_token_id, tok.bos_token_id, tok.eos_token_id}
    assert ids == {0, 1, 2} and tok.chat_template is None
    text = "x = <NUM_LIT> + 7\nprint('<STR_LIT>', 'Grüße 🙂')"  # unseen characters: byte-level, no unk
    enc = tok(text)["input_ids"]
    assert tok.decode(enc) == text and tok.eos_token_id not in enc  # adds no special tokens itself
    assert tok.convert_tokens_to_ids("<NUM_LIT>") in enc  # placeholders stay whole ...
    assert tok.decode(enc, skip_special_tokens=True) == text  # ... and are not special
    again = train_tiny_tokenizer(sample_texts(), tmp_path / "again", vocab_size=320, added_tokens=ADDED)
    assert (again / "tokenizer.json").read_text() == (tok_dir / "tokenizer.json").read_text()


# --- pretrained from a local folder ----------------------------------------------------------

def test_from_pretrained_folder_trains_and_keeps_plain_state_dict(model_dir):
    from safetensors.torch import load_file

    model = hf_causal_lm(path=str(model_dir))
    assert model.hf.config.model_type == "qwen3" and model.source["path"] == str(model_dir.resolve())
    assert all(m.training for m in model.modules())  # as a built model: Lightning's fit keeps modes
    saved = load_file(model_dir / "model.safetensors")
    state = model.state_dict()
    assert set(state) == {f"hf.{k}" for k in model.hf.state_dict()}
    assert all(torch.equal(state[f"hf.{k}"], v) for k, v in saved.items())  # the saved weights, as saved

    b = batch(model)
    out = model(**b)
    assert out.logits.shape == (*b["input_ids"].shape, len(model.tokenizer)) == (*b["input_ids"].shape,
                                                                                 model.vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        loss = model(**b).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0], losses


def test_generate_passes_through_with_left_padding(model_dir):
    model = hf_causal_lm(path=str(model_dir)).eval()
    tok = model.tokenizer
    assert tok.padding_side == "right"  # left padding is asked for per call by the collator
    prompts = tok(["Question: 1 + 2 = ? Answer:", "The cat"], return_tensors="pt", padding=True,
                  padding_side="left")
    first = model.generate(**prompts, max_new_tokens=4, do_sample=False)
    again = model.generate(**prompts, max_new_tokens=4, do_sample=False)
    width = prompts["input_ids"].shape[1]
    assert torch.equal(first, again) and width < first.shape[1] <= width + 4
    assert torch.equal(first[:, :width], prompts["input_ids"])
    assert model.hf.generation_config.pad_token_id == tok.pad_token_id


def test_config_overrides_on_a_folder_apply_and_typos_are_refused(model_dir):
    model = hf_causal_lm(path=str(model_dir), config={"use_cache": False})
    assert model.config.use_cache is False
    with pytest.raises(UserError) as err:
        hf_causal_lm(path=str(model_dir), config={"use_cahce": False})
    assert "use_cahce" in str(err.value) and "did you mean 'use_cache'" in str(err.value)


@pytest.mark.parametrize("name", ["clbench-tests/no-such-model", "/no/such/folder/qwen3"])
def test_model_not_on_disk_is_one_line_telling_to_download(name):
    with pytest.raises(UserError) as err:
        hf_causal_lm(path=name)
    text = str(err.value)
    assert "\n" not in text and err.value.where == "model.init_args.path"
    assert "download" in text and "hf download" in text and "local folder" in text


def test_loading_a_model_draws_no_progress_bar(model_dir, capfd):
    """transformers 5 draws a "Loading weights" bar per load: noise once per entry in a verify."""
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()
    hf_causal_lm(path=str(model_dir))
    captured = capfd.readouterr()
    assert "Loading weights" not in captured.err + captured.out
    assert hf_logging.is_progress_bar_enabled()  # put back for the caller


def test_folder_without_weights_or_tokenizer_is_named(model_dir, tmp_path):
    no_weights = tmp_path / "no-weights"
    shutil.copytree(model_dir, no_weights)
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(UserError, match="cannot load from .*no-weights") as err:
        hf_causal_lm(path=str(no_weights))
    assert "\n" not in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds no tokenizer"):
        hf_causal_lm(path=str(model_dir), tokenizer=str(tmp_path / "empty"))


# --- random initialisation -------------------------------------------------------------------

@pytest.mark.parametrize("architecture,dtype", [("qwen3", "float32"), ("llama", "bfloat16")])
def test_random_init_of_a_named_architecture(tok_dir, architecture, dtype):
    model = hf_causal_lm(architecture=architecture, config=tiny_config(architecture, layers=2, hidden=32),
                         tokenizer=str(tok_dir), dtype=dtype)
    cfg, tok = model.config, model.tokenizer
    assert cfg.model_type == architecture and cfg.num_hidden_layers == 2 and cfg.hidden_size == 32
    assert cfg.vocab_size == len(tok) == model.vocab_size
    assert (cfg.pad_token_id, cfg.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    assert {p.dtype for p in model.parameters()} == {getattr(torch, dtype)}
    assert model.config._attn_implementation == "sdpa"
    b = batch(model, n=2)
    assert model(**b).logits.shape[-1] == len(tok)


def test_random_init_config_is_checked(tok_dir):
    base = tiny_config("qwen3")
    wide = hf_causal_lm(architecture="qwen3", config={**base, "vocab_size": 384}, tokenizer=str(tok_dir))
    assert wide.vocab_size == 384  # a larger embedding (e.g. a real model's) is kept
    cases = [({"config": {**base, "vocab_size": 100}}, "smaller than the tokenizer"),
             ({"config": {**base, "num_hiden_layers": 2}}, "did you mean 'num_hidden_layers'"),
             ({"architecture": "qwen33"}, "did you mean 'qwen3'"),
             ({"tokenizer": None}, "needs a tokenizer")]
    for change, message in cases:
        args = {"architecture": "qwen3", "config": base, "tokenizer": str(tok_dir), **change}
        with pytest.raises(UserError, match=message) as err:
            hf_causal_lm(**args)
        assert err.value.where.startswith("model.init_args") and "\n" not in str(err.value)
    with pytest.raises(UserError, match="exactly one of path"):
        hf_causal_lm(tokenizer=str(tok_dir))


def test_missing_pad_token_becomes_eos(tok_dir, tmp_path):
    no_pad = tmp_path / "no-pad"
    shutil.copytree(tok_dir, no_pad)
    settings = json.loads((no_pad / "tokenizer_config.json").read_text())
    del settings["pad_token"]
    (no_pad / "tokenizer_config.json").write_text(json.dumps(settings))
    model = hf_causal_lm(architecture="llama", config=tiny_config("llama"), tokenizer=str(no_pad))
    assert model.tokenizer.pad_token == model.tokenizer.eos_token == "<eos>"
    assert model.config.pad_token_id == model.tokenizer.eos_token_id


# --- dtype, attention, gradient checkpointing ------------------------------------------------

def test_bad_dtype_and_attention_are_one_line_errors(model_dir):
    with pytest.raises(UserError, match="expected one of 'float32', 'bfloat16', 'float16', got str 'bf16'") as err:
        checked(hf_causal_lm, "model.init_args", path=str(model_dir), dtype="bf16")
    assert err.value.where == "model.init_args.dtype"
    with pytest.raises(UserError, match="did you mean 'sdpa'"):
        checked(hf_causal_lm, "model.init_args", path=str(model_dir), attn_implementation="spda")


def test_flash_attention_is_refused_when_it_cannot_run(model_dir):
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None and torch.cuda.is_available():
        with pytest.raises(UserError, match="needs bfloat16 or float16"):
            hf_causal_lm(path=str(model_dir), attn_implementation="flash_attention_2", dtype="float32")
        return
    with pytest.raises(UserError, match="flash_attention_2 cannot be used") as err:
        hf_causal_lm(path=str(model_dir), attn_implementation="flash_attention_2", dtype="bfloat16")
    assert "\n" not in str(err.value) and "sdpa" in str(err.value)


def test_gradient_checkpointing_is_set_and_gives_the_same_gradients(model_dir):
    plain = hf_causal_lm(path=str(model_dir)).train()
    checkpointed = hf_causal_lm(path=str(model_dir), gradient_checkpointing=True).train()
    assert checkpointed.gradient_checkpointing and not plain.gradient_checkpointing
    assert any(getattr(m, "gradient_checkpointing", False) for m in checkpointed.hf.modules())
    b = batch(plain, n=4)
    for model in (plain, checkpointed):
        model(**b).loss.backward()
    for (name, p), q in zip(plain.named_parameters(), checkpointed.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


# --- counting and plugging in ----------------------------------------------------------------

def test_parameter_counts_total_trainable_and_tied(tok_dir):
    config = tiny_config("qwen3", layers=1, hidden=32)
    untied = hf_causal_lm(architecture="qwen3", config={**config, "tie_word_embeddings": False},
                          tokenizer=str(tok_dir))
    tied = hf_causal_lm(architecture="qwen3", config={**config, "tie_word_embeddings": True}, tokenizer=str(tok_dir))
    embedding = untied.vocab_size * 32
    counts = untied.parameter_counts()
    assert counts["total"] == counts["trainable"] == sum(p.numel() for p in untied.hf.parameters())
    assert tied.parameter_counts()["total"] == counts["total"] - embedding  # shared once
    untied.hf.get_input_embeddings().weight.requires_grad_(False)
    assert parameter_counts(untied) == {"total": counts["total"], "trainable": counts["trainable"] - embedding}


def test_registered_builder_takes_no_stream_arguments(model_dir):
    from clbench import registry
    from clbench.plugins.build import check_init_args

    assert registry.resolve("models", "hf_causal_lm", where="test") is hf_causal_lm
    check_init_args(hf_causal_lm, {"path": str(model_dir), "dtype": "bfloat16", "gradient_checkpointing": True,
                                   "config": {"use_cache": False}}, "cfg.yaml: model.init_args")
    with pytest.raises(UserError, match="unknown argument 'num_classes'"):
        check_init_args(hf_causal_lm, {"num_classes": 10}, "cfg.yaml: model.init_args")
