"""Language-model throughput: training and generation tokens/s through clbench and a plain loop.

Both contenders get the same randomly initialised Qwen3 (built once by
``clbench.models.lm.causal_lm.hf_causal_lm`` with the ``trace-mini`` tokenizer, then deep-copied) and the
same batches: collated once by the causal-LM objective's ``TextCollator`` and served to both by
one ``DataLoader`` over that list (``batch_size=None``). Batches stay on the CPU; each side moves
them to the device per step (Lightning by itself, the plain loop with ``.to``).

- Training, one epoch of ``--steps`` batches per round, each row exactly ``--seq-len`` tokens
  (trace-mini prompts joined until long enough; the collator cuts them from the left; the loss
  is on the answer tokens). clbench: ``ContinualModule`` (base ``Strategy``, objective
  ``CausalLanguageModeling``) fitted by one Trainer from ``clbench.engine.trainer.make_trainer``, its
  ``fit_loop.max_epochs`` raised by one per round, as the runner does per experience. Plain: a
  fresh AdamW per round (Lightning builds one per ``fit``), forward, the objective's shifted
  cross-entropy written out, backward, step, zero_grad. Tokens: the batches' attention-mask sum.
- Generation, ``--gen-batches`` left-padded batches of trace-mini test prompts per round, greedy
  with the KV cache. clbench: ``trainer.validate(module, [loader])`` (the objective generates,
  decodes and scores). Plain: ``model.generate(..., do_sample=False, use_cache=True)``. Both
  models have ``generation_config.min_new_tokens = --gen-new-tokens``, so no row stops at EOS
  and each side generates exactly prompts x new tokens, which is what is counted.

Both train in the weights' dtype (``--dtype bfloat16``: bf16 weights and AdamW states, no
autocast; the Trainer keeps its default precision, 32-true). ``--deterministic`` (clbench's
default) is process-wide, so it holds for both sides. One untimed warm-up round, then
``--rounds`` rounds; who goes first alternates; on CUDA the clocks are read after a synchronise.
Ratios are clbench time / plain time within a round (target <= 1.10), and their median. On CUDA,
MFU = tokens/s x (6 x (non-embedding parameters + vocab x hidden) + 12 x layers x heads x
head_dim x seq-len) / peak bf16 dense FLOP/s (989e12 on H100/H200; ``--peak-tflops``
otherwise): PaLM's count, with the LM head's matmul included (it is computed whether or not its
weight is tied to the embedding) and attention over the full (not causal) square.

    OMP_NUM_THREADS=1 python perf/lm_throughput.py                       # CPU, tiny: about a minute
    python perf/lm_throughput.py --size qwen3-0.6b --device cuda --dtype bfloat16 \\
        --seq-len 2048 --batch-size 4 --steps 60 --gen-batches 4 --gen-new-tokens 64 --rounds 5

On the CPU, glibc hands freed memory back to the system and page-faults it in again, which costs
either side a few percent and the plain loop more (its allocations are ordered differently);
``MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736`` in the environment
keeps it (see ``docs/performance.md``).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
import warnings

SIZES = {
    "tiny": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "intermediate_size": 128},
    "qwen3-0.6b": {"num_hidden_layers": 28, "hidden_size": 1024, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936,
                   "max_position_embeddings": 40960, "tie_word_embeddings": True},
}
PEAK_BF16 = {"H100": 989e12, "H200": 989e12}


def long_records(records: list[dict], tokenizer, seq_len: int, count: int) -> list[dict]:
    """``count`` records whose prompt has at least ``seq_len`` tokens: trace-mini prompts joined
    (the answer is the last one's), so the collator cuts every row to exactly ``seq_len``."""
    lengths = [len(ids) for ids in tokenizer([r["prompt"] for r in records], add_special_tokens=False)["input_ids"]]
    out, j = [], 0
    for _ in range(count):
        parts, total = [], 0
        while total < seq_len + 8:  # a margin: tokens may merge across the joins
            parts.append(records[j % len(records)]["prompt"])
            total += lengths[j % len(records)] + 1
            j += 1
        out.append({"prompt": "\n\n".join(parts), "answer": records[(j - 1) % len(records)]["answer"]})
    return out


def train_flops_per_token(hf, seq_len: int, frozen_base: bool = False) -> float:
    """Training FLOPs per token of a transformers causal LM: PaLM's count, 6 x (non-embedding
    parameters + vocab x hidden: the LM head's matmul, tied or not) + 12 x layers x heads x
    head_dim x seq_len (attention over the full square). With ``frozen_base`` the weights get no
    gradients: 4 x instead of 6 x (forward, and the backward through the activations only)."""
    c = hf.config
    embeddings = {id(m.weight): m.weight.numel() for m in (hf.get_input_embeddings(), hf.get_output_embeddings())}
    non_embedding = sum(p.numel() for p in hf.parameters()) - sum(embeddings.values())
    attention_width = c.num_attention_heads * getattr(c, "head_dim", c.hidden_size // c.num_attention_heads)
    head = c.vocab_size * c.hidden_size
    return (4 if frozen_base else 6) * (non_embedding + head) + 12 * c.num_hidden_layers * attention_width * seq_len


def plain_train(model, loader, lr: float, device):
    import torch
    import torch.nn.functional as F

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)  # fresh per round, as each fit builds one
    model.train()
    for batch in loader:
        ids, mask, labels = (batch[k].to(device, non_blocking=True) for k in ("input_ids", "attention_mask", "labels"))
        logits = model(input_ids=ids, attention_mask=mask).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def plain_generate(model, loader, new_tokens: int, device, tokenizer) -> list:
    import torch

    model.eval()
    outs = []
    with torch.no_grad():
        for batch in loader:
            ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, use_cache=True,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
            outs.append(out[:, ids.shape[1]:])
    return outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", choices=list(SIZES))
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per training sequence")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=32, help="training batches per round")
    parser.add_argument("--gen-batches", type=int, default=8)
    parser.add_argument("--gen-batch-size", type=int, default=None, help="default: --batch-size")
    parser.add_argument("--gen-new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=True,
                        help="Trainer(deterministic=...), clbench's default; process-wide, so both sides")
    parser.add_argument("--peak-tflops", type=float, default=None, help="peak bf16 dense TFLOP/s for MFU")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: stable on a shared CPU)")
    args = parser.parse_args()
    gen_bs = args.gen_batch_size or args.batch_size

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # as clbench.engine.runner.run does
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")

    from clbench.benchmarks.trace_mini import generate
    from clbench.models.lm.causal_lm import hf_causal_lm
    from clbench.engine.module import ContinualModule
    from clbench.objectives.causal_lm import CausalLanguageModeling
    from clbench.seeding import seed_all
    from clbench.strategy import Strategy
    from clbench.data.streams import StreamSpec
    from clbench.engine.trainer import make_trainer, quiet_lightning

    quiet_lightning()
    cuda = args.device == "cuda"
    device = torch.device(args.device)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    seed_all(0)
    initial = hf_causal_lm(architecture="qwen3", tokenizer="trace-mini", config=SIZES[args.size], dtype=args.dtype,
                           attn_implementation="sdpa")
    initial.hf.generation_config.min_new_tokens = args.gen_new_tokens  # fixed length on both sides
    tok = initial.tokenizer
    objective = CausalLanguageModeling(max_length=args.seq_len, max_new_tokens=args.gen_new_tokens)
    objective.setup(StreamSpec(name="lm-throughput", objective="causal_lm"), [])
    objective.attach(initial)

    data = generate(n_train=200, n_eval=0, n_test=50, seed=0)
    train_pool = [r for rs in zip(*(d["train"] for d in data.values())) for r in rs]  # tasks interleaved
    test_pool = [r for rs in zip(*(d["test"] for d in data.values())) for r in rs]
    train_records = long_records(train_pool, tok, args.seq_len, args.steps * args.batch_size)
    collate_train, collate_test = objective.collate(train=True), objective.collate(train=False)
    train_batches = [collate_train(train_records[i * args.batch_size:(i + 1) * args.batch_size])
                     for i in range(args.steps)]
    gen_batches = [collate_test([test_pool[(i * gen_bs + k) % len(test_pool)] for k in range(gen_bs)])
                   for i in range(args.gen_batches)]
    train_loader = DataLoader(train_batches, batch_size=None)  # one loader, the same batches, for both
    gen_loader = DataLoader(gen_batches, batch_size=None)
    train_tokens = sum(int(b["attention_mask"].sum()) for b in train_batches)
    gen_tokens = args.gen_batches * gen_bs * args.gen_new_tokens

    # The contenders: clbench's module and Trainer, and the plain transformers model.
    plain = copy.deepcopy(initial).hf.to(device)
    module = ContinualModule(copy.deepcopy(initial), Strategy(), objective,
                             optimizer=lambda params: torch.optim.AdamW(params, lr=args.lr), columns=[None])
    cfg = {"trainer": {"accelerator": "gpu" if cuda else "cpu", "devices": 1},
           "train": {"deterministic": args.deterministic}}
    trainer = make_trainer(cfg, "perf/lm_throughput.py")
    plain_outputs: list = []

    def clbench_train():
        trainer.fit_loop.max_epochs = trainer.current_epoch + 1  # one more epoch, as the runner's stages
        trainer.fit(module, train_loader)

    def clbench_generate():
        trainer.validate(module, [gen_loader], verbose=False)

    def plain_gen():
        plain_outputs[:] = plain_generate(plain, gen_loader, args.gen_new_tokens, device, tok)

    jobs = {"plain": {"train": lambda: plain_train(plain, train_loader, args.lr, device), "gen": plain_gen},
            "clbench": {"train": clbench_train, "gen": clbench_generate}}
    names = list(jobs)
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds + 1):  # round 0: warm-up, not counted
        times: dict[str, float] = {}
        order = names[r % 2:] + names[:r % 2]  # alternate who goes first
        for phase in ("train", "gen"):  # generation after both have trained: the weights are the same
            for name in order:
                sync()
                t0 = time.perf_counter()
                jobs[name][phase]()
                sync()
                times[f"{name} {phase}"] = time.perf_counter() - t0
        if r:
            rounds.append(times)

    # Checks: same weights after training, same generations.
    harness_hf = module.model.hf
    diff = max(float((a.detach().cpu().float() - b.detach().cpu().float()).abs().max())
               for a, b in zip(harness_hf.parameters(), plain.parameters()))
    lengths = {int(o.shape[1]) for o in plain_outputs}
    texts = [t.strip() for o in plain_outputs for t in tok.batch_decode(o, skip_special_tokens=True)]
    harness_texts = [row["prediction"] for row in objective._generations.get("all", [])]
    same = sum(a == b for a, b in zip(texts, harness_texts))

    n_params = sum(p.numel() for p in plain.parameters())
    embeddings = {id(plain.get_input_embeddings().weight): plain.get_input_embeddings().weight.numel(),
                  id(plain.get_output_embeddings().weight): plain.get_output_embeddings().weight.numel()}
    non_embedding = n_params - sum(embeddings.values())
    c = plain.config
    print(f"{args.size} qwen3 ({c.num_hidden_layers} layers, hidden {c.hidden_size}, vocab {c.vocab_size}, "
          f"{n_params / 1e6:.1f}M parameters, {non_embedding / 1e6:.1f}M non-embedding) on {args.device} "
          f"({torch.cuda.get_device_name() if cuda else f'torch threads={torch.get_num_threads()}'}), "
          f"{args.dtype} weights, sdpa, deterministic={args.deterministic}")
    print(f"training: {args.steps} steps x batch {args.batch_size} x {args.seq_len} tokens = {train_tokens} tokens "
          f"per round; generation: {args.gen_batches} batches x {gen_bs} prompts x {args.gen_new_tokens} new tokens "
          f"(min_new_tokens forced on both sides) = {gen_tokens} tokens per round; {args.rounds} rounds after one "
          f"warm-up, contenders interleaved, who goes first alternating")
    figures = ["plain train", "clbench train", "plain gen", "clbench gen"]
    ratios = {"train ratio": ("clbench train", "plain train"), "gen ratio": ("clbench gen", "plain gen")}
    print(f"{'round':>6}" + "".join(f"{k:>15}" for k in figures) + "".join(f"{k:>13}" for k in ratios))
    for i, t in enumerate(rounds):
        print(f"{i + 1:>6}" + "".join(f"{t[k]:14.3f}s" for k in figures)
              + "".join(f"{t[a] / t[b]:13.3f}" for a, b in ratios.values()))
    med = {k: statistics.median(t[k] for t in rounds) for k in figures}
    med_ratio = {k: statistics.median(t[a] / t[b] for t in rounds) for k, (a, b) in ratios.items()}
    print(f"{'median':>6}" + "".join(f"{med[k]:14.3f}s" for k in figures)
          + "".join(f"{med_ratio[k]:13.3f}" for k in ratios))
    for what, tokens, key in (("training", train_tokens, "train"), ("generation", gen_tokens, "gen")):
        plain_rate, clbench_rate = tokens / med[f"plain {key}"], tokens / med[f"clbench {key}"]
        print(f"{what + ' tokens/s':<22}: plain {plain_rate:10.1f}   clbench {clbench_rate:10.1f}"
              f"   clbench/plain time: median of per-round ratios {med_ratio[f'{key} ratio']:.3f} (target <= 1.10)")
    overhead = (med["clbench train"] - med["plain train"]) / args.steps
    print(f"clbench's extra time per training step (medians, per-fit set-up included): {overhead * 1e3:.2f} ms")
    if cuda:
        name = torch.cuda.get_device_name()
        peak = (args.peak_tflops * 1e12 if args.peak_tflops
                else next((v for k, v in PEAK_BF16.items() if k in name), None))
        flops = train_flops_per_token(plain, args.seq_len)
        if peak is None:
            print(f"MFU: unknown peak for {name}; give --peak-tflops")
        else:
            mfu = {k: train_tokens / med[f"{k} train"] * flops / peak for k in names}
            print(f"training MFU ({flops / 1e9:.2f} GFLOP/token, peak {peak / 1e12:.0f} TFLOP/s): "
                  f"plain {mfu['plain']:.1%}   clbench {mfu['clbench']:.1%}")
        # Lightning's Strategy.teardown moves the module (and the optimizer state) to the CPU after
        # every fit and validate; the next call moves it back. One round trip of the weights:
        sync()
        t0 = time.perf_counter()
        module.to(device)
        sync()
        t1 = time.perf_counter()
        module.cpu()
        sync()
        gb = sum(p.numel() * p.element_size() for p in module.parameters()) / 1e9
        print(f"weights ({gb:.2f} GB) to the GPU {t1 - t0:.3f}s, back to the CPU {time.perf_counter() - t1:.3f}s: "
              f"Lightning's Strategy.teardown moves the module (and the optimizer state) to the CPU after every "
              f"fit and validate, and the next call moves it back")
    print(f"weights after training, max |clbench - plain| = {diff:.3g}; plain generations all "
          f"{sorted(lengths)} tokens long; last round's generations equal to the plain loop's: {same}/{len(texts)}")


if __name__ == "__main__":
    main()
