"""Sharded evaluation's padding and the refusals of ``trainer.strategy: fsdp``, in one process.

Under sharded parameters every forward is a collective, so every rank must evaluate as many
batches as the largest shard has; the shorter shards are lengthened with padding batches that
must change nothing. The two-process runs themselves are in ``test_fsdp.py``.
"""

from __future__ import annotations

import torch
from helpers import run_cli, tiny_config


def shard_batches(n: int, world: int, rank: int, batch: int = 2) -> list:
    from clbench.data.datasets import ArrayDataset, run_loader

    data = ArrayDataset(torch.arange(n, dtype=torch.float32)[:, None], torch.arange(n))
    cfg = {"train": {"batch_size": batch, "eval_batch_size": batch, "num_workers": 0}, "trainer": {}}
    return list(run_loader(cfg, data, shuffle=False, world_size=world, rank=rank))


def test_every_evaluation_shard_is_padded_to_the_largest_and_scores_each_sample_once():
    from clbench.data.datasets import Padding

    for n, world, batch in [(5, 2, 2), (7, 3, 2), (9, 4, 2), (8, 2, 4), (0, 2, 2)]:
        shards = [shard_batches(n, world, rank, batch) for rank in range(world)]
        assert len({len(shard) for shard in shards}) == 1, (n, world)  # equally many forwards on every rank
        real = sorted(int(y) for shard in shards for b in shard if not isinstance(b, Padding) for y in b[1])
        assert real == list(range(n))  # every test sample once
        pads = [b for shard in shards for b in shard if isinstance(b, Padding)]
        assert len(pads) <= world - 1 and all(b.batch[1].tolist() == [0] for b in pads)
    assert not any(isinstance(b, Padding) for b in shard_batches(5, 1, 0))
    # a test set smaller than the number of processes: empty shards, padded to one batch
    shards = [shard_batches(1, 2, rank) for rank in range(2)]
    assert [len(shard) for shard in shards] == [1, 1] and isinstance(shards[1][0], Padding)


def test_padding_batches_change_no_score_routing_record_or_generation():
    """One evaluation with two padding batches added to every column equals one without."""
    import lightning.pytorch as pl
    from lm_helpers import lm, stream

    from clbench.data.datasets import LockstepLoader, make_loader
    from clbench.engine.evaluation import EvaluationLog
    from clbench.engine.module import ContinualModule
    from clbench.metrics.routing_recording import RoutingRecording
    from clbench.objectives.causal_lm import CausalLanguageModeling
    from clbench.data.streams import StreamSpec
    from clbench.strategies.moe_lora import LoRAMoE

    experiences = stream()
    model = lm()
    objective = CausalLanguageModeling(max_length=48, max_new_tokens=3)
    objective.setup(StreamSpec(name="t", objective="causal_lm"), experiences)
    objective.attach(model)
    strategy = LoRAMoE(r=2)
    module = ContinualModule(model, strategy, objective, optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
                             columns=experiences)
    strategy.setup(module.context, experiences, 0)
    strategy.adapt_model(module.context, 0)
    with torch.no_grad():  # experts that route differently from the start
        for name, p in model.named_parameters():
            if "lora_B" in name or "router" in name:
                p.normal_(0, 0.5)
    collate = objective.collate(train=False)
    loaders = [make_loader(exp.test, 3, shuffle=False, collate_fn=collate) for exp in experiences]
    recording = RoutingRecording(column_domains=[0, 1], num_domains=2)
    recording.old_domains = {0, 1}
    log = EvaluationLog()
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[recording, log])

    def evaluate(loaders) -> tuple:
        trainer.validate(module, loaders, verbose=False)
        evaluation = log.take()[-1]
        return evaluation.values, evaluation.routing, evaluation.compositions, dict(objective._generations)

    plain = evaluate(loaders)
    padded = evaluate([LockstepLoader(loader, len(loader) + 2, lambda: next(iter(loader))) for loader in loaders])
    assert plain[1] and plain[2] and all(plain[3].values())  # routing recorded, generations kept
    assert padded == plain


def test_fsdp_refuses_what_it_cannot_shard(tmp_path, write_yaml):
    """A strategy that does not support sharded parameters, a model with no transformer blocks,
    and Lightning's FSDP1 wrapper: one line each, exit 2, before any process starts."""
    from lm_helpers import lm_config

    moses = {**lm_config({"class_path": "moses", "init_args": {"r": 2}}),
             "trainer": {"accelerator": "cpu", "devices": 1, "strategy": "fsdp"}}
    digits = tiny_config(trainer={"accelerator": "cpu", "devices": 1, "strategy": "fsdp"})
    for cfg, message in [(moses, "does not support sharded parameters"),
                         (digits, "names no transformer blocks to shard")]:
        proc = run_cli("run", "--config", str(write_yaml(cfg)), "--output", str(tmp_path / "out"), "--no-progress")
        assert proc.returncode == 2, proc.stderr[-2000:]
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0] and "trainer.strategy" in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "result.json").exists()
