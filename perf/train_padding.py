"""How much of a language-model run's training compute goes to padding, and what grouping by length saves.

A training batch is right-padded to its longest row, and a padded position costs a forward and
backward like a real one. ``train.group_by_length: true`` puts rows of near-equal length in one
batch (transformers' ``LengthGroupedSampler``, :func:`clbench.data.datasets.training_order`);
it is off by default because it changes which rows share a batch, so a run with it is a
different run. This script counts, per experience of a run config, the positions its training
batches take (the causal-LM objective's collator, ``train.batch_size`` rows):

- ``shuffled``: the batches of a shuffled loader, the default;
- ``grouped``: the batches ``group_by_length`` gives, seeded alike;
- ``sorted``: the same rows cut into batches after sorting by length, the least padding any
  grouping reaches at that batch size.

``real`` is the share of positions that are tokens; ``saves`` is shuffled over grouped positions,
``ceiling`` shuffled over sorted: how far a per-token cost falls. It counts, it does not time:
attention's cost grows faster than linearly with the row's length, so the time saved on long
rows can exceed the count's share, and a fixed cost per step makes it smaller.

    OMP_NUM_THREADS=1 python perf/train_padding.py                 # the every-order suite's first cell
    OMP_NUM_THREADS=1 python perf/train_padding.py --config configs/examples/trace-mini-smollm2.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "examples" / "trace-mini-smollm2-orders-mh_moe.yaml"


def positions(lengths: list[int], batch_size: int) -> int:
    """Padded positions when ``lengths`` are cut into batches in the order given."""
    return sum(max(lengths[i:i + batch_size]) * len(lengths[i:i + batch_size])
               for i in range(0, len(lengths), batch_size))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(CONFIG), help="a causal-LM run config")
    parser.add_argument("--seed", type=int, default=0, help="the shuffled loader's seed")
    args = parser.parse_args()

    import torch

    from clbench.config.load import load_config
    from clbench.data.datasets import make_loader, training_order
    from clbench.engine.parts import build_parts

    torch.set_num_threads(1)
    parts = build_parts(load_config(args.config))
    batch_size = parts.config.train.batch_size
    collate = parts.objective.collate(train=True)
    print(f"{Path(args.config).name}: batch {batch_size}, max_length {parts.objective.max_length}\n")
    print("| experience | rows | tokens | shuffled | real | grouped | real | saves | sorted | real | ceiling |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for exp in parts.experiences:
        lengths = []
        for batch in make_loader(exp.train, batch_size, shuffle=True, seed=args.seed, collate_fn=collate):
            lengths += batch["attention_mask"].sum(1).tolist()
        own = parts.objective.lengths(exp.train)  # what group_by_length groups by, in dataset order
        grouped = positions([own[i] for i in training_order(exp.train, batch_size, args.seed, own)], batch_size)
        tokens, shuffled, ordered = sum(lengths), positions(lengths, batch_size), positions(sorted(lengths), batch_size)
        print(f"| {exp.name} | {len(lengths)} | {tokens:,} | {shuffled:,} | {tokens / shuffled:.3f} | {grouped:,} "
              f"| {tokens / grouped:.3f} | {shuffled / grouped:.3f}x | {ordered:,} | {tokens / ordered:.3f} "
              f"| {shuffled / ordered:.3f}x |")


if __name__ == "__main__":
    main()
