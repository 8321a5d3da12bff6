"""The precision a run computes in when its config does not say: bf16-mixed for a language
model on a CPU with bf16 units, fp32 otherwise; recorded in the result."""

from __future__ import annotations

import pytest
from helpers import tiny_config

from clbench import cpu_kernels
from clbench.engine import precision

TINY = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 128, "max_position_embeddings": 256}


def _lm(**overrides) -> dict:
    from clbench.config.load import resolve_config

    raw = tiny_config(benchmark={"class_path": "trace-mini",
                                 "init_args": {"tasks": ["FOMC", "NumGLUE-cm"], "n_train": 16, "n_test": 4}},
                      model={"class_path": "hf_causal_lm",
                             "init_args": {"architecture": "qwen3", "tokenizer": "trace-mini", "config": TINY}},
                      train={"epochs": 1, "batch_size": 8})
    raw["model"]["init_args"].pop("hidden", None)
    return resolve_config({**raw, **overrides})


@pytest.fixture(autouse=True)
def machine_default(monkeypatch):
    """The machine's own default, which the rest of the test suite switches off (conftest.py)."""
    monkeypatch.delenv(precision.ENV_SWITCH, raising=False)


@pytest.mark.parametrize("units", [True, False])
def test_a_language_model_defaults_to_bf16_only_where_the_cpu_has_bf16_units(monkeypatch, units):
    from clbench.config.load import resolve_config

    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: units)
    lm = _lm()  # its objective is the stream's (trace-mini declares causal_lm)
    assert precision.default_precision(lm, "x.yaml") == ("bf16-mixed" if units else None)
    # the config's own setting wins, and other objectives keep fp32
    assert precision.default_precision(_lm(trainer={"accelerator": "cpu", "devices": 1, "precision": "32-true"}),
                                       "x.yaml") is None
    assert precision.default_precision(resolve_config(tiny_config()), "x.yaml") is None
    assert precision.default_precision(_lm(trainer={"accelerator": "gpu", "devices": 1}), "x.yaml") is None
    # the switch keeps fp32; a pinned precision (an entry's, rerun by verify) wins over the CPU
    monkeypatch.setenv(precision.ENV_SWITCH, "0")
    assert precision.default_precision(lm, "x.yaml") is None
    for recorded in ("32-true", "bf16-mixed"):
        with precision.pinned(recorded):
            assert precision.default_precision(lm, "x.yaml") == recorded


def test_the_cpu_flags_decide_bf16_units(monkeypatch, tmp_path):
    import builtins

    real_open = builtins.open
    monkeypatch.setattr(cpu_kernels, "in_effect", lambda: "avx512")  # kernels that reach the units
    for flags, expected in (("fpu sse avx2 avx512f", False), ("fpu avx512f avx512_bf16", True),
                            ("fpu amx_tile amx_bf16", True)):
        info = tmp_path / "cpuinfo"
        info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        monkeypatch.setattr(builtins, "open",
                            lambda path, *a, **k: real_open(info if path == "/proc/cpuinfo" else path, *a, **k))
        cpu_kernels.cpu_flags.cache_clear()
        assert precision.cpu_bf16_units() is expected
    # kernels pinned to AVX2 emulate bf16 matmuls: the units are there, but not used
    monkeypatch.setattr(cpu_kernels, "in_effect", lambda: "avx2")
    assert precision.cpu_bf16_units() is False
    monkeypatch.setattr(builtins, "open", real_open)
    cpu_kernels.cpu_flags.cache_clear()


def test_the_run_trains_in_the_chosen_precision_and_records_it(tmp_path, monkeypatch):
    import torch

    from clbench.engine.runner import run

    seen = []
    original = torch.nn.functional.cross_entropy

    def spy(logits, *args, **kwargs):  # the objective upcasts the logits it was given
        seen.append(torch.is_autocast_enabled("cpu"))
        return original(logits, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", spy)
    plain = run(_lm(), tmp_path / "fp32")
    assert plain["env"]["precision"] == "32-true" or precision.cpu_bf16_units()
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: True)
    seen.clear()
    mixed = run(_lm(), tmp_path / "bf16")
    assert mixed["env"]["precision"] == "bf16-mixed"
    assert seen and all(seen)  # every training loss was computed under bf16 autocast
    assert all(v is not None for row in mixed["r_matrix"] for v in row)


def _spy_decoding(monkeypatch, record):
    """``record(model)`` each time the causal-LM objective decodes a batch: through transformers'
    ``generate`` or through its own greedy loop."""
    from clbench.objectives.causal_lm import CausalLanguageModeling

    def spied(original):
        def spy(self, model, *args, **kwargs):
            record(model)
            return original(self, model, *args, **kwargs)
        return spy

    for decoder in ("generate", "decode_loop"):
        monkeypatch.setattr(CausalLanguageModeling, decoder, spied(getattr(CausalLanguageModeling, decoder)))


@pytest.mark.parametrize("chosen", ["bf16-mixed", "32-true"])
def test_pooled_generation_runs_in_the_run_s_precision(tmp_path, monkeypatch, chosen):
    """Generation is deferred to the end of the evaluation pass (pooled), outside Lightning's
    per-step precision context; it must still compute as the run's steps do: under bf16 autocast
    in a bf16-mixed run, in fp32 in a 32-true one (the control)."""
    import torch

    from clbench.engine.runner import run

    seen = []
    _spy_decoding(monkeypatch, lambda model: seen.append(torch.is_autocast_enabled("cpu")))
    result = run(_lm(trainer={"accelerator": "cpu", "devices": 1, "precision": chosen}), tmp_path / "run")
    assert result["env"]["precision"] == chosen
    assert seen and all(enabled == (chosen == "bf16-mixed") for enabled in seen)


def _casts_and_tokens(model, ids, keep: bool):
    """Greedy tokens under bf16 autocast, and how many dtype casts ran (profiler's aten::_to_copy)."""
    import contextlib

    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16), \
            (precision.casts_kept(model) if keep else contextlib.nullcontext()):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                                 min_new_tokens=6, do_sample=False)
    return out, sum(e.count for e in prof.key_averages() if e.key == "aten::_to_copy")


def test_a_decode_under_autocast_casts_each_frozen_weight_once_with_the_same_tokens():
    import torch

    from clbench.models.lm.causal_lm import hf_causal_lm

    torch.manual_seed(0)
    model = hf_causal_lm(architecture="qwen3", tokenizer="trace-mini", config=TINY).eval().requires_grad_(False)
    ids = torch.randint(3, 200, (4, 10))
    (per_op, casts), (kept, kept_casts) = (_casts_and_tokens(model, ids, keep) for keep in (False, True))
    assert torch.equal(per_op, kept)  # the same cast, so the same tokens
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert casts - kept_casts >= 5 * linears  # 7 forwards: each Linear's weight cast once, not 7 times
    assert not any(p.requires_grad for p in model.parameters())  # frozen again after the span
    with precision.casts_kept(model):  # outside autocast: nothing is marked
        assert not any(p.requires_grad for p in model.parameters())
    with pytest.raises(RuntimeError), torch.autocast("cpu", torch.bfloat16), precision.casts_kept(model):
        assert all(p.requires_grad for p in model.parameters())
        raise RuntimeError
    assert not any(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("chosen", ["bf16-mixed", "32-true"])
def test_a_bf16_mixed_run_decodes_with_its_frozen_base_cast_once(tmp_path, monkeypatch, chosen):
    """In a bf16-mixed LoRA run the pooled decode sees every weight marked (so autocast keeps
    its casts), and training still sees the base frozen; in fp32 (the control) nothing is marked."""
    from clbench.engine.runner import run

    marked = []
    _spy_decoding(monkeypatch, lambda model: marked.append(
        all(p.requires_grad for p in model.parameters() if p.is_floating_point())))
    result = run(_lm(strategy={"class_path": "seq_lora"},
                     trainer={"accelerator": "cpu", "devices": 1, "precision": chosen}), tmp_path / "run")
    assert marked and all(m == (chosen == "bf16-mixed") for m in marked)
    assert 0 < result["model"]["params_trainable"] < result["model"]["params_total"] / 10


def test_verify_reruns_an_entry_in_the_precision_it_records(tmp_path, monkeypatch):
    """Whatever this CPU would pick: an entry recording bf16-mixed reruns in bf16-mixed, one made
    before precision was recorded reruns in fp32, the default then."""
    from clbench.config.load import config_hash
    from clbench.leaderboard.cell import rerun

    cfg = _lm()
    entry = {"config": cfg, "config_hash": config_hash(cfg), "benchmark": {"name": "trace-mini"},
             "model": {"name": "hf_causal_lm"}, "strategy": {"name": "naive"}, "order_label": "default",
             "seed": 0, "suite": "t", "execution": {"torch_threads": 1}}
    for units, recorded, expected in ((False, "bf16-mixed", "bf16-mixed"), (True, None, "32-true")):
        monkeypatch.setattr(precision, "cpu_bf16_units", lambda: units)
        new = rerun({**entry, "env": {"precision": recorded} if recorded else {}}, tmp_path / str(units), source="t")
        assert new["status"] == "ok" and new["env"]["precision"] == expected


def test_a_resumed_run_goes_on_in_its_checkpoints_precision(tmp_path, monkeypatch):
    """Started where fp32 was the default and resumed where bf16 would be: the later stages stay
    fp32, and the checkpoint says so; a checkpoint from before precision was saved means fp32."""
    import torch
    from helpers import crash_at

    from clbench.engine.runner import run

    cfg = _lm()
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: False)
    crash_at(monkeypatch, "stage:1:step:1", cfg, tmp_path / "run")
    saved = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    assert saved["settings"]["precision"] == "32-true" and precision.saved_precision({"settings": {}}) == "32-true"
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: True)
    resumed = run(cfg, tmp_path / "run", resume=True)
    assert resumed["compute"]["resumes"] == 1 and resumed["env"]["precision"] == "32-true"
    assert precision.default_precision(cfg, "x.yaml") == "bf16-mixed"  # the pin ended with the run
