"""Every shipped experiment config resolves and passes the pre-flight check, and its strategy
accepts its arguments: a config that only runs on a GPU cluster is still checked here."""

from pathlib import Path

import pytest

from clbench.plugins.build import build_strategy, preflight
from clbench.config.load import resolve_config
from clbench.config.yaml_files import read_yaml

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_experiment_config_is_valid(path):
    cfg = resolve_config(read_yaml(path), source=str(path))
    preflight(cfg, str(path))
    build_strategy(cfg, str(path))  # the strategy's own checks of its arguments


def test_the_moe_methods_have_real_trace_configs():
    names = {p.stem for p in CONFIGS}
    assert {f"trace_qwen3_0.6b_{m}" for m in ("loramoe", "mh_moe", "moses")} <= names


SUITES = sorted((Path(__file__).resolve().parents[2] / "configs" / "suites").glob("*.yaml"))
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "configs" / "examples").glob("*.yaml"))


def test_every_suite_and_config_compares_adapters_at_one_scale():
    """α/r is equal among the adapters of each suite, and among the experiment and example
    configs that run on one benchmark and model (the configs compared with each other)."""
    from clbench.config.load import canonical_json
    from clbench.leaderboard.adapter_scales import adapter_scales, check_adapter_scales
    from clbench.leaderboard.suite import load_suite

    seen = 0
    for path in SUITES:
        suite = load_suite(path)
        runs = [(run.strategy, run.config) for run in suite.runs]
        check_adapter_scales(runs, where=str(path))
        seen += sum(bool(adapter_scales(cfg)) for _, cfg in runs)
    groups: dict[str, list] = {}
    for path in CONFIGS + EXAMPLES:
        cfg = resolve_config(read_yaml(path), source=str(path))
        groups.setdefault(canonical_json([cfg["benchmark"], cfg["model"]]), []).append((path.stem, cfg))
    for runs in groups.values():
        check_adapter_scales(runs, where=", ".join(stem for stem, _ in runs))
    assert seen > 20  # the LLM suites' adapter runs were read


def _lm_suite(tmp_path, strategies: list) -> Path:
    import yaml

    suite = {"name": "scales", "benchmarks": [{"class_path": "trace-mini", "init_args": {"n_train": 4, "n_test": 2}}],
             "models": [{"class_path": "hf_causal_lm",
                         "init_args": {"architecture": "qwen3", "tokenizer": "trace-mini",
                                       "config": {"num_hidden_layers": 1, "hidden_size": 16,
                                                  "num_attention_heads": 2, "num_key_value_heads": 1,
                                                  "head_dim": 8, "intermediate_size": 32}}}],
             "strategies": strategies, "orders": ["default"], "seeds": [0],
             "base": {"objective": {"class_path": "causal_lm"}, "trainer": {"accelerator": "cpu", "devices": 1}}}
    path = tmp_path / "scales.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


LORA = {"class_path": "seq_lora", "init_args": {"r": 8, "alpha": 16}}
EWC_ON_LORA = {"class_path": "ewc", "model_args": {"lora": {"r": 4, "alpha": 16}}}


@pytest.mark.parametrize("other, message", [
    ({"class_path": "mh_moe", "init_args": {"match_lora_rank": 8, "alpha": 16}},
     "the adapter scale α/r of mh_moe is not known before the run"),
    ({"class_path": "mh_moe", "init_args": {"match_lora_rank": 8, "scale": 3}},
     "adapters are compared at unequal scales α/r: seq_lora 2, mh_moe 3"),
    ({"class_path": "moses", "init_args": {"r": 2, "alpha": 8}}, "seq_lora 2, moses 4"),
    (EWC_ON_LORA, "seq_lora 2, ewc model.lora 4"),
    ({"class_path": "o_lora"}, "seq_lora 2, o_lora 4"),  # o_lora's default alpha 32 at r 8
])
def test_a_suite_with_unequal_adapter_scales_is_refused_before_any_run(tmp_path, other, message):
    from clbench.errors import UserError
    from clbench.leaderboard.suite import load_suite, preflight

    path = _lm_suite(tmp_path, [LORA, other])
    with pytest.raises(UserError) as err:
        preflight(load_suite(path))
    assert message in err.value.one_line() and f"{path}: strategies" in err.value.one_line()


def test_a_suite_with_one_adapter_scale_passes_the_check(tmp_path):
    from clbench.leaderboard.adapter_scales import adapter_scales, check_adapter_scales
    from clbench.leaderboard.suite import load_suite

    suite = load_suite(_lm_suite(tmp_path, [LORA, "seq_ft",
                                            {"class_path": "mh_moe", "init_args": {"match_lora_rank": 8, "scale": 2}},
                                            {"class_path": "moses", "init_args": {"r": 2, "alpha": 4}},
                                            {"class_path": "ewc", "model_args": {"lora": {"r": 4, "alpha": 8}}}]))
    runs = [(run.strategy, run.config) for run in suite.runs]
    check_adapter_scales(runs, where="suite")
    assert [adapter_scales(cfg) for _, cfg in runs] == [
        {"strategy": 2.0}, {}, {"strategy": 2.0}, {"strategy": 2.0}, {"model.lora": 2.0}]
