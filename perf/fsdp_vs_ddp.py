"""Sharded (``trainer.strategy: fsdp``) against data-parallel (``ddp``) LoRA training: tokens/s and memory.

Two ``ContinualModule``s with ``seq_lora`` (r = 8 on the query and value projections, the
strategy's defaults) on one randomly initialised Qwen3 (built once by
``clbench.models.lm.causal_lm.hf_causal_lm``, then deep-copied, so both start from the same weights and
the same adapter), each fitted by its own Trainer from ``clbench.engine.trainer.make_trainer``: one with
``strategy: ddp``, one with ``strategy: fsdp`` (FSDP2 on the decoder blocks,
:mod:`clbench.engine.sharding`). Both read the same batches: trace-mini prompts joined to exactly
``--seq-len`` tokens, collated once by the causal-LM objective, each rank reading its shard
through the runner's loader. One epoch of ``--steps`` batches per round and contender (a
``fit``, as the runner runs one per experience); one untimed warm-up round, then ``--rounds``
rounds, who goes first alternating; per-round ratios fsdp / ddp of the time, and their median.

Memory, per contender: *resident* = its parameters, gradients and optimizer states as held
on this rank (the local shards under FSDP), read from the tensors after its round; *step peak*
(CUDA only) = the most memory allocated during its round beyond what was allocated when the
round began (activations, gathered blocks, gradients). Their sum is what the contender needs;
the other contender's resident memory is excluded from both.

On one GPU FSDP shards nothing (one shard holds all) and only its bookkeeping is measured; on N
GPUs (``torchrun --nproc-per-node N``) each rank holds 1/N of the weights::

    OMP_NUM_THREADS=1 python perf/fsdp_vs_ddp.py                      # CPU, tiny: checks the path
    python perf/fsdp_vs_ddp.py --size qwen3-0.6b --device cuda --dtype bfloat16 \\
        --seq-len 1024 --batch-size 4 --steps 30 --rounds 5
    torchrun --nproc-per-node 8 perf/fsdp_vs_ddp.py --size qwen3-0.6b --device cuda --dtype bfloat16 ...

``--json PATH`` also writes the figures to a file (``perf/gpu_report.py`` reads it).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
import warnings

from lm_throughput import SIZES, long_records


def resident_bytes(module, optimizers) -> int:
    """Parameters, gradients and optimizer states as held on this rank (local shards)."""
    import torch
    from torch.distributed.tensor import DTensor

    def local(t) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    total = 0
    for p in module.parameters():
        total += local(p) + (local(p.grad) if p.grad is not None else 0)
    for optimizer in optimizers:
        for state in optimizer.state.values():
            total += sum(local(v) for v in state.values() if isinstance(v, torch.Tensor))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", choices=list(SIZES))
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4, help="per process")
    parser.add_argument("--steps", type=int, default=8, help="training batches per round and process")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the figures to this file (rank 0)")
    args = parser.parse_args()

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    from clbench.benchmarks.trace_mini import generate
    from clbench.data.datasets import run_loader
    from clbench.models.lm.causal_lm import hf_causal_lm
    from clbench.engine.module import ContinualModule
    from clbench.objectives.causal_lm import CausalLanguageModeling
    from clbench.seeding import seed_all
    from clbench.data.streams import StreamSpec
    from clbench.engine.trainer import make_trainer, quiet_lightning
    from clbench.strategies.lora import SeqLoRA

    quiet_lightning()
    cuda = args.device == "cuda"
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    seed_all(0)
    initial = hf_causal_lm(architecture="qwen3", tokenizer="trace-mini", config=SIZES[args.size], dtype=args.dtype,
                           attn_implementation="sdpa")
    objective = CausalLanguageModeling(max_length=args.seq_len)
    objective.setup(StreamSpec(name="fsdp-vs-ddp", objective="causal_lm"), [])
    objective.attach(initial)
    data = generate(n_train=200, n_eval=0, n_test=0, seed=0)
    pool = [r for rs in zip(*(d["train"] for d in data.values())) for r in rs]
    records = long_records(pool, initial.tokenizer, args.seq_len, args.steps * args.batch_size * world)
    cfg = {"train": {"batch_size": args.batch_size, "eval_batch_size": args.batch_size, "num_workers": 0,
                     "deterministic": False},
           "trainer": {"accelerator": "gpu" if cuda else "cpu", "devices": world if world > 1 else 1}}
    loader = run_loader(cfg, records, shuffle=True, seed=0, world_size=world, rank=rank,
                        collate_fn=objective.collate(train=True))
    tokens = sum(int(b["attention_mask"].sum()) for b in loader)  # this rank's, per round

    contenders = {}
    for kind in ("ddp", "fsdp"):
        seed_all(1)  # the same adapter in both
        strategy = SeqLoRA()
        module = ContinualModule(copy.deepcopy(initial), strategy, objective,
                                 optimizer=lambda params: torch.optim.AdamW(params, lr=args.lr), columns=[None])
        strategy.setup(module, [], 0)
        trainer = make_trainer({**cfg, "trainer": {**cfg["trainer"], "strategy": kind}}, "perf/fsdp_vs_ddp.py")
        contenders[kind] = (module, trainer)

    rounds: list[dict[str, float]] = []
    memory: dict[str, tuple[int, int]] = {}
    names = list(contenders)
    for r in range(args.rounds + 1):  # round 0: warm-up (and sharding), not counted
        times = {}
        for kind in names[r % 2:] + names[:r % 2]:
            module, trainer = contenders[kind]
            sync()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
                start = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            trainer.fit_loop.max_epochs = trainer.current_epoch + 1
            trainer.fit(module, loader)
            sync()
            times[kind] = time.perf_counter() - t0
            step = torch.cuda.max_memory_allocated() - start if cuda else -1
            memory[kind] = (resident_bytes(module, trainer.optimizers), step)
        if r:
            rounds.append(times)

    if rank:
        return
    c = initial.config
    n_params = sum(p.numel() for p in initial.parameters())
    print(f"{args.size} qwen3 ({c.num_hidden_layers} layers, hidden {c.hidden_size}, {n_params / 1e6:.1f}M "
          f"parameters) + seq_lora r=8 on {args.device} "
          f"({torch.cuda.get_device_name() if cuda else f'torch threads={torch.get_num_threads()}'}), "
          f"{args.dtype} weights, {world} process(es); per round and process: {args.steps} steps x batch "
          f"{args.batch_size} x {args.seq_len} tokens = {tokens} tokens; {args.rounds} rounds after one warm-up")
    print(f"{'round':>6}{'ddp':>12}{'fsdp':>12}{'fsdp/ddp':>10}")
    for i, t in enumerate(rounds):
        print(f"{i + 1:>6}{t['ddp']:11.3f}s{t['fsdp']:11.3f}s{t['fsdp'] / t['ddp']:10.3f}")
    med = {k: statistics.median(t[k] for t in rounds) for k in names}
    ratio = statistics.median(t["fsdp"] / t["ddp"] for t in rounds)
    print(f"{'median':>6}{med['ddp']:11.3f}s{med['fsdp']:11.3f}s{ratio:10.3f}")
    for kind in names:
        resident, step = memory[kind]
        peak = f", step peak {step / 2**20:.1f} MiB, total {(resident + step) / 2**20:.1f} MiB" if cuda else ""
        print(f"{kind:>4}: {tokens / med[kind]:10.1f} tokens/s per process; resident {resident / 2**20:.1f} MiB{peak}")
    if args.json:
        import json

        figures = {"world": world, "tokens": tokens, "device": torch.cuda.get_device_name() if cuda else "cpu",
                   "rounds": rounds, "ratios": [t["fsdp"] / t["ddp"] for t in rounds],
                   **{kind: {"tokens_per_s": tokens / med[kind], "resident_bytes": memory[kind][0],
                             "step_peak_bytes": memory[kind][1] if cuda else None} for kind in names}}
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=1)


if __name__ == "__main__":
    main()
