"""Training-step time of the LoRA-expert layers against one plain LoRA, on the same model and batch.

Three copies of one randomly initialised Qwen3 (``clbench.models.lm.causal_lm.hf_causal_lm``, the
``trace-mini`` tokenizer) get, on the MLP's gate/up/down projections: ``seq_lora`` (peft LoRA,
rank ``--lora-rank``), ``loramoe`` (K = 4, top-1) and ``mh_moe`` (``--heads`` heads, K = 4,
top-1), the two mixtures at the rank matching the LoRA's active parameters
(``rank_for_budget``, as ``match_lora_rank`` does). Each is injected by its strategy's own
``setup`` path, so the layers are those a run trains. One batch of random token ids
(``--batch-size`` × ``--seq-len``) is shared. A step is forward, causal-LM loss, backward, AdamW
step, zero_grad; a round times ``--steps`` steps of each method, the order rotating per round,
after an untimed warm-up round; on CUDA the clock is read after a synchronise.

Printed per round: the step time of each method and the ratios mh_moe / seq_lora,
loramoe / seq_lora and mh_moe / loramoe; then their medians (target: mh_moe / loramoe <= 1.05).

    OMP_NUM_THREADS=1 python perf/moe_adapter_step.py                  # CPU, tiny: seconds
    python perf/moe_adapter_step.py --device cuda --hidden 1024 --intermediate 3072 --layers 8 \\
        --heads 8 --seq-len 512 --batch-size 8 --rounds 7
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

METHODS = ("seq_lora", "loramoe", "mh_moe")


class _Module:  # what strategy.setup reads: the model
    def __init__(self, model):
        self.model = model


def build(args):
    from clbench.models.lm.causal_lm import hf_causal_lm

    torch.manual_seed(0)
    heads = max(1, args.hidden // 64)
    config = {"num_hidden_layers": args.layers, "hidden_size": args.hidden, "num_attention_heads": heads,
              "num_key_value_heads": heads, "head_dim": min(64, args.hidden),
              "intermediate_size": args.intermediate, "max_position_embeddings": max(256, args.seq_len)}
    return hf_causal_lm(architecture="qwen3", tokenizer="trace-mini", config=config)


def adapted(base, method: str, args):
    from clbench.strategies.lora import SeqLoRA
    from clbench.strategies.moe_lora import LoRAMoE, MHMoE

    mlp = ["gate_proj", "up_proj", "down_proj"]
    if method == "seq_lora":
        strategy = SeqLoRA(r=args.lora_rank, alpha=16.0, dropout=0.0, target_modules=mlp)
    elif method == "loramoe":
        strategy = LoRAMoE(match_lora_rank=args.lora_rank)
    else:
        strategy = MHMoE(heads=args.heads, match_lora_rank=args.lora_rank)
    model = copy.deepcopy(base)
    strategy.setup(_Module(model), [], 0)
    model.to(args.device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    if method != "seq_lora":
        with torch.no_grad():  # B = 0 makes no difference to the cost, but keep the gates moving
            for p in params:
                p.normal_(0, 0.02)
    return model, torch.optim.AdamW(params, lr=1e-3), getattr(strategy, "active_params", None)


def steps(model, optimizer, ids, n: int, device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / n


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--intermediate", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4, help="MH-MoE heads (input slices)")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    base = build(args)
    ids = torch.randint(0, base.hf.config.vocab_size, (args.batch_size, args.seq_len), generator=torch.Generator()
                        .manual_seed(0)).to(args.device)
    runs = {m: adapted(base, m, args) for m in METHODS}
    for m, (_, _, active) in runs.items():
        print(f"{m}: active adapter parameters per token {active if active is not None else f'LoRA r={args.lora_rank}'}")
    for m in METHODS:  # warm-up
        steps(*runs[m][:2], ids, 1, args.device)
    ratios = {"mh_moe/seq_lora": [], "loramoe/seq_lora": [], "mh_moe/loramoe": []}
    for round_ in range(args.rounds):
        order = METHODS[round_ % 3:] + METHODS[:round_ % 3]
        t = {m: steps(*runs[m][:2], ids, args.steps, args.device) for m in order}
        for key, values in ratios.items():
            a, b = key.split("/")
            values.append(t[a] / t[b])
        print(f"round {round_}: " + ", ".join(f"{m} {t[m] * 1e3:.1f} ms" for m in METHODS) + " | "
              + ", ".join(f"{k} {v[-1]:.3f}" for k, v in ratios.items()))
    medians = {k: statistics.median(v) for k, v in ratios.items()}
    print("median: " + ", ".join(f"{k} {v:.3f}" for k, v in medians.items())
          + f" (target mh_moe/loramoe <= 1.05: {'met' if medians['mh_moe/loramoe'] <= 1.05 else 'NOT met'})")
    return medians


if __name__ == "__main__":
    main()
