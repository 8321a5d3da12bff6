"""Evaluation of a language-model run: pooled, bucketed generation against batch-by-batch decoding.

One evaluation pass of a run (every test column of its stream), timed two ways in one process,
rounds interleaved (who goes first alternates), on the model the config builds:

- ``per-batch``: what the causal-LM objective did before pooling, and what ``model.generate``
  alone does: each loader batch of ``train.eval_batch_size`` prompts, left-padded to its
  longest, decoded by one ``generate`` call up to its column's ``max_new_tokens``;
- ``pooled by cap``: pooling as it was before the greedy loop: every batch kept, rows grouped
  by answer cap, sorted by column and prompt length, ``objective.init_args.generation_batch``
  rows a batch, each batch decoded by one ``generate`` call (a column's shared instruction
  prefilled once): what a run still does with ``kv_cache: static`` or a hooked model (MoSEs);
- ``pooled``: the objective's evaluation as a run does it: every batch kept, then decoded by
  :meth:`~clbench.objectives.causal_lm.CausalLanguageModeling.finish_evaluation` in batches of
  any caps, each column's rows prefilled apart by length bucket, one greedy loop a batch that
  drops each row at its EOS or cap (:mod:`clbench.objectives.greedy_loop`).

``--phases`` then times one more ``pooled`` pass split into its forwards: the prefill's
(positions computed, seconds, ms a position) and the decoding steps' (steps and ms a step by
the rows still live): where the greedy loop's time goes.

``--bf16`` adds both again under ``torch.autocast("cpu", torch.bfloat16)``, as a ``bf16-mixed``
run evaluates (the default of a language model on a CPU with bf16 units,
:mod:`clbench.engine.precision`): ``per-batch bf16`` and ``pooled bf16``. On a CPU without bf16
units those matmuls are emulated and slow. ``--static`` adds ``pooled static``: the pooled pass
decoding with ``kv_cache: static`` (:mod:`clbench.objectives.kv_cache`; eager on a CPU).

All decode greedily with the KV cache, stop a row at EOS or its cap, and are decoded to text
the same way; all are given the same collated batches. Tokens/s counts the tokens each
generated before its row stopped (EOS included). Each text is compared row by row with
``per-batch``'s (fp32, the old path): a row that differs is counted (a row's logits round
differently beside other rows, or in bf16).

    OMP_NUM_THREADS=1 python perf/lm_generation.py                 # the README's SmolLM2 run: minutes
    OMP_NUM_THREADS=1 python perf/lm_generation.py --bf16          # and in bf16 (a CPU with bf16 units)
    OMP_NUM_THREADS=1 python perf/lm_generation.py --static        # and pooled with the static KV cache
    OMP_NUM_THREADS=1 python perf/lm_generation.py --phases        # and the loop's prefill against its steps
    OMP_NUM_THREADS=1 python perf/lm_generation.py --config configs/examples/trace-mini-seq_ft.yaml
    python perf/lm_generation.py benchmark.init_args.n_test=32 objective.init_args.generation_batch=32
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
import warnings
from unittest import mock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/examples/trace-mini-smollm2.yaml")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bf16", action="store_true", help="also time both under bf16 autocast (bf16-mixed)")
    parser.add_argument("--static", action="store_true", help="also time the pooled pass with kv_cache: static")
    parser.add_argument("--phases", action="store_true",
                        help="also time one pooled pass split into prefill and decoding steps")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import torch
    from torchmetrics import MetricCollection

    from clbench.config.load import load_config
    from clbench.engine.parts import build_parts
    from clbench.metrics.text import TEXT_METRICS
    from clbench.results.assemble import cpu_identity

    torch.set_num_threads(args.threads)
    parts = build_parts(load_config(args.config, args.overrides), args.config)
    objective, model = parts.objective, parts.model.eval()
    tok = objective.tokenizer
    collate = objective.collate(train=False)
    size = parts.cfg["train"]["eval_batch_size"] or parts.cfg["train"]["batch_size"]
    batches = []  # (column, collated batch)
    for column in parts.experiences:
        records = [column.test[i] for i in range(len(column.test))]
        batches += [(column, collate(records[i:i + size])) for i in range(0, len(records), size)]
    prompts = sum(len(b["prompts"]) for _, b in batches)

    def per_batch() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for column, batch in batches:
            raw = TEXT_METRICS[objective.metric_name(column)].scoring == "trace"  # as the objective decides
            out.setdefault(column.name, []).extend(objective.generate(
                model, batch["input_ids"], batch["attention_mask"], objective.new_tokens(column), raw=raw))
        return out

    def pooled() -> dict[str, list[str]]:
        objective.begin_evaluation()
        for column, batch in batches:
            objective.evaluate(model, batch, MetricCollection(objective.metrics(column)), column)
        objective.finish_evaluation(model)
        return {name: [row["prediction"] for row in rows] for name, rows in objective._generations.items()}

    def generated(texts: dict[str, list[str]]) -> int:
        """Tokens decoded before each row stopped: its text's tokens, plus the EOS where it stopped early."""
        count = 0
        for column in parts.experiences:
            for text in texts[column.name]:
                n = len(tok(text, add_special_tokens=False)["input_ids"])
                count += min(objective.new_tokens(column), n + 1)
        return count

    def in_bf16(fn):
        def wrapped():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return fn()
        return wrapped

    def static_cache():
        objective.kv_cache, kept = "static", objective.kv_cache
        try:
            return pooled()
        finally:
            objective.kv_cache = kept

    def pooled_by_cap():
        with mock.patch("clbench.objectives.greedy_loop.loop_decodes", return_value=False):
            return pooled()

    contenders = {"per-batch": per_batch, "pooled by cap": pooled_by_cap, "pooled": pooled}
    if args.bf16:
        contenders.update({"per-batch bf16": in_bf16(per_batch), "pooled bf16": in_bf16(pooled)})
    if args.static:
        contenders["pooled static"] = static_cache
    cpu = cpu_identity()
    print(f"{args.config}: {prompts} prompts in {len(batches)} loader batches of {size}, "
          f"{len(parts.experiences)} columns; {next(model.parameters()).dtype}; CPU {cpu['model']} ({cpu['isa']}), "
          f"{args.threads} thread(s)", flush=True)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    outputs: dict[str, dict[str, list[str]]] = {}
    with torch.no_grad():
        for r in range(args.rounds):
            order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
            for name in order:
                start = time.perf_counter()
                outputs[name] = contenders[name]()
                times[name].append(time.perf_counter() - start)
            print(f"round {r + 1}: " + ", ".join(f"{n} {times[n][-1]:.1f}s" for n in contenders), flush=True)
    tokens = {name: generated(outputs[name]) for name in contenders}
    base = statistics.median(times["per-batch"])

    def differ(name: str) -> int:
        return sum(a != b for column in outputs["per-batch"]
                   for a, b in zip(outputs["per-batch"][column], outputs[name][column]))

    print("\n| contender | seconds a pass (median) | generated tokens | tokens/s | x per-batch "
          "| rows unlike per-batch |")
    print("|---|---|---|---|---|---|")
    for name in contenders:
        seconds = statistics.median(times[name])
        print(f"| {name} | {seconds:.1f} | {tokens[name]} | {tokens[name] / seconds:.1f} | {base / seconds:.2f} | "
              f"{differ(name)} of {prompts} |")
    print(f"\npooled batches: {objective._generation_rows}")
    if args.phases:
        phases(model, pooled)


def phases(model, pooled) -> None:
    """One ``pooled`` pass with every forward of the model timed: a forward over more than one
    position a row is prefill, one over a single position a decoding step."""
    hf = getattr(model, "hf", model)
    forward = hf.forward
    prefill, steps = [], []  # (positions, seconds), (rows, seconds)

    @functools.wraps(forward)  # the loop reads the signature (logits_to_keep)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = forward(*args, **kwargs)
        seconds, ids = time.perf_counter() - start, kwargs["input_ids"]
        if ids.shape[1] == 1:
            steps.append((ids.shape[0], seconds))
        else:
            prefill.append((ids.numel(), seconds))
        return out

    hf.forward = timed
    try:
        start = time.perf_counter()
        pooled()
        total = time.perf_counter() - start
    finally:
        del hf.forward
    positions, seconds = sum(n for n, _ in prefill), sum(t for _, t in prefill)
    print(f"\none pooled pass, {total:.1f} s: prefill {seconds:.1f} s in {len(prefill)} forwards, {positions} "
          f"positions, {1000 * seconds / max(positions, 1):.1f} ms a position; {len(steps)} decoding steps "
          f"{sum(t for _, t in steps):.1f} s")
    print("| live rows | steps | ms a step (median) |")
    print("|---|---|---|")
    for low, high in ((1, 1), (2, 8), (9, 24), (25, 64), (65, 10**9)):
        times = [t for rows, t in steps if low <= rows <= high]
        if times:
            label = str(low) if low == high else (f"{low}-{high}" if high < 10**9 else f"{low}+")
            print(f"| {label} | {len(times)} | {1000 * statistics.median(times):.0f} |")


if __name__ == "__main__":
    main()
