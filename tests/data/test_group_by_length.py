"""``train.group_by_length``: training batches of near-equal lengths, seeded, sharded like any
training order, off unless asked for (and then the same config as one that never named it)."""

from __future__ import annotations

import random

import pytest
from helpers import tiny_config

from clbench.data.datasets import run_loader, training_order
from clbench.errors import UserError

CFG = {"train": {"batch_size": 8, "eval_batch_size": 8, "num_workers": 0}, "trainer": {"accelerator": "cpu"}}


def padded(batches: list[list[int]], lengths: list[int]) -> int:
    """Positions the batches take when each is padded to its longest sample."""
    return sum(max(lengths[i] for i in b) * len(b) for b in batches)


def epochs(loader, n: int = 2) -> list[list[list[int]]]:
    return [list(loader) for _ in range(n)]


@pytest.fixture
def lengths() -> list[int]:
    rng = random.Random(0)
    return [rng.randrange(5, 120) for _ in range(200)]


def test_grouped_batches_pad_less_and_every_epoch_takes_every_sample_once(lengths):
    data = list(range(len(lengths)))
    grouped = epochs(run_loader(CFG, data, shuffle=True, seed=3, lengths=lengths, collate_fn=list))
    shuffled = epochs(run_loader(CFG, data, shuffle=True, seed=3, collate_fn=list))
    for epoch in grouped:
        assert sorted(i for b in epoch for i in b) == data and all(len(b) == 8 for b in epoch)
        # the longest sample leads, so memory runs out at the first step if it is to run out
        assert max(lengths[i] for i in epoch[0]) == max(lengths)
    assert grouped[0] != grouped[1]  # reshuffled every epoch
    assert grouped == epochs(run_loader(CFG, data, shuffle=True, seed=3, lengths=lengths, collate_fn=list))
    assert grouped[0] != epochs(run_loader(CFG, data, shuffle=True, seed=4, lengths=lengths, collate_fn=list))[0]
    for g, s in zip(grouped, shuffled):
        assert padded(g, lengths) < 0.8 * padded(s, lengths)


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_split_the_single_process_batches(lengths, world):
    """W processes at batch b take, step by step, the batches one process takes at W·b."""
    data = list(range(len(lengths)))
    one = run_loader({**CFG, "train": {**CFG["train"], "batch_size": 8 * world}}, data, shuffle=True, seed=3,
                     lengths=lengths, collate_fn=list)
    ranks = [run_loader(CFG, data, shuffle=True, seed=3, lengths=lengths, collate_fn=list, world_size=world, rank=r)
             for r in range(world)]
    for _ in range(2):  # two epochs
        steps = list(zip(*[list(r) for r in ranks]))
        assert [sorted(i for b in step for i in b) for step in steps] == [sorted(b) for b in one]


def test_lengths_must_match_the_samples(lengths):
    with pytest.raises(ValueError, match="199 lengths for 200 samples"):
        training_order(list(range(200)), 8, 0, lengths[:-1])


def test_off_is_the_config_that_never_named_it():
    from clbench.config.load import config_hash, resolve_config

    plain = resolve_config(tiny_config())
    off = resolve_config(tiny_config(train={"group_by_length": False}))
    on = resolve_config(tiny_config(train={"group_by_length": True}))
    assert off == plain and config_hash(off) == config_hash(plain) != config_hash(on)
    assert on["train"]["group_by_length"] is True


def test_an_objective_without_lengths_is_refused_before_anything_is_built():
    from clbench.config.load import resolve_config
    from clbench.plugins.build import preflight

    cfg = resolve_config(tiny_config(train={"group_by_length": True}), source="run.yaml")
    with pytest.raises(UserError) as err:
        preflight(cfg, "run.yaml")
    assert err.value.where == "run.yaml: train.group_by_length" and "no length" in str(err.value)
    assert "\n" not in err.value.one_line()


def test_a_language_model_run_trains_on_grouped_batches(monkeypatch, tmp_path):
    """The run's training batches: the same samples, fewer padded positions."""
    from clbench.api import run
    from clbench.config.load import resolve_config
    from clbench.objectives.causal_lm import CausalLanguageModeling

    seen: list[tuple[int, int]] = []
    split = CausalLanguageModeling.split

    def spy(self, batch):
        if self.model.training:
            seen.append((batch["attention_mask"].numel(), int(batch["attention_mask"].sum())))
        return split(self, batch)

    monkeypatch.setattr(CausalLanguageModeling, "split", spy)
    tiny = {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 16, "intermediate_size": 64, "max_position_embeddings": 256}
    totals = {}
    for grouped in (False, True):
        raw = tiny_config(benchmark={"class_path": "trace-mini",
                                     "init_args": {"tasks": ["FOMC", "20Minuten"], "n_train": 48, "n_test": 2}},
                          model={"class_path": "hf_causal_lm",
                                 "init_args": {"architecture": "qwen3", "tokenizer": "trace-mini", "config": tiny}},
                          objective={"class_path": "causal_lm", "init_args": {"max_length": 128, "max_new_tokens": 2}},
                          train={"epochs": 1, "batch_size": 4, "group_by_length": grouped})
        raw["model"]["init_args"].pop("hidden", None)
        seen.clear()
        run(resolve_config(raw), tmp_path / str(grouped))
        totals[grouped] = (len(seen), sum(n for n, _ in seen), sum(t for _, t in seen))
    (steps, positions, tokens), (steps_g, positions_g, tokens_g) = totals[False], totals[True]
    assert steps == steps_g == 24 and tokens == tokens_g  # every sample once, in 12 batches a task
    assert positions_g < 0.97 * positions, totals
