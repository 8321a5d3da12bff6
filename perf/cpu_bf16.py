"""SmolLM2 on the CPU in fp32 against its fast paths: training samples/s, generated tokens/s, same outputs?

Four contenders, interleaved round by round in one process (who goes first rotates), on
SmolLM2-135M-Instruct (``clbench models fetch smollm2-135m-instruct``) with one rank-8 LoRA on
the MLP's gate/up/down projections (the trace-mini-smollm2 suites' seq_lora):

- ``fp32``: everything in float32 (the default where the CPU has no bf16 units);
- ``bf16-mixed``: the same float32 model under ``torch.autocast("cpu", torch.bfloat16)``, which
  is what ``trainer.precision: bf16-mixed`` runs (clbench's default for a language model on a CPU
  with bf16 units, :mod:`clbench.engine.precision`);
- ``bf16-base``: the frozen base weights cast to bfloat16, the LoRA weights left float32;
- ``fp32-answer-logits``: fp32 with the training logits computed over the answer window only
  (the causal-LM objective's ``answer_logits_only``, its default for a frozen head such as this
  LoRA's); its generation is fp32's.

Training: ``--train-batches`` batches of ``--batch-size`` trace-mini records (C-STANCE, FOMC,
ScienceQA, NumGLUE-cm, collated by the causal-LM objective's ``TextCollator``) per round:
forward, prompt-masked cross-entropy, backward, AdamW step on the adapter. Each contender
trains its own copy from the same start; the first batch's loss is compared with fp32's.
Generation: ``--gen-batches`` left-padded batches of test prompts, greedy, exactly
``--new-tokens`` tokens each (``min_new_tokens``), with the untrained adapter (a zero update), so
the greedy tokens of every contender are compared with fp32's.

On a CPU without bf16 units (no ``amx_bf16``/``avx512_bf16`` flag) a bf16 matmul is emulated,
tens of times slower than fp32: keep the sizes small there.

    OMP_NUM_THREADS=1 python perf/cpu_bf16.py                                 # bf16 units: minutes
    OMP_NUM_THREADS=1 python perf/cpu_bf16.py --rounds 1 --train-batches 1 --batch-size 2 \\
        --gen-batches 1 --gen-batch-size 4 --new-tokens 2                       # no bf16 units
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time
import warnings

TASKS = ["C-STANCE", "FOMC", "ScienceQA", "NumGLUE-cm"]
CONTENDERS = ("fp32", "bf16-mixed", "bf16-base", "fp32-answer-logits")


def load(preset: str):
    from clbench.models.lm.causal_lm import hf_causal_lm
    from clbench.strategies.lora import add_adapter, lora_config

    model = hf_causal_lm(path=preset)
    hf = model.hf
    add_adapter(hf, lora_config(8, 16.0, 0.0, ["gate_proj", "up_proj", "down_proj"], None), "default")
    for name, p in hf.named_parameters():
        p.requires_grad = "lora_" in name
    return hf, model.tokenizer


def bf16_base(hf):
    """A copy whose frozen weights are bfloat16 and whose LoRA weights stay float32."""
    import torch

    other = copy.deepcopy(hf)
    for name, p in other.named_parameters():
        if "lora_" not in name:
            p.data = p.data.to(torch.bfloat16)
    return other


def batches(tokenizer, batch_size: int, count: int, train: bool) -> list[dict]:
    from clbench.benchmarks.trace_mini import trace_mini
    from clbench.objectives.text_batches import TextCollator

    scenario = trace_mini(tasks=TASKS, n_train=max(8, batch_size * count), n_test=max(8, batch_size * count))
    records = []
    for exp in scenario.train_stream if train else scenario.test_stream:
        records += [exp.dataset[i] for i in range(len(exp.dataset))]
    records = records[::max(1, len(records) // (batch_size * count))][: batch_size * count]  # every task
    collate = TextCollator(tokenizer, max_length=160, train=train, max_new_tokens=8)
    return [collate(records[i: i + batch_size]) for i in range(0, len(records), batch_size)]


def context(name: str):
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16) if name == "bf16-mixed" else contextlib.nullcontext()


def train(hf, name: str, loader: list[dict], optimizer) -> list[float]:
    import torch
    import torch.nn.functional as F

    from clbench.objectives.text_batches import answer_window

    hf.train()
    losses = []
    for batch in loader:
        labels, x = batch["labels"], {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        if name == "fp32-answer-logits":  # what the objective's answer_logits_only does
            start, end = answer_window(labels)
            logits = hf(**x, logits_to_keep=torch.arange(start, end)).logits
            labels = labels[:, start + 1: end + 1]
        else:  # answer_logits_only: false: logits of every position, shifted
            with context(name):
                logits = hf(**x).logits[:, :-1]
            labels = labels[:, 1:]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def generate(hf, name: str, loader: list[dict], new_tokens: int, tokenizer) -> list[list[int]]:
    import torch

    hf.eval()
    rows = []
    with torch.no_grad(), context(name):
        for batch in loader:
            ids = batch["input_ids"]
            out = hf.generate(input_ids=ids, attention_mask=batch["attention_mask"], max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, use_cache=True,
                              pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
            rows += out[:, ids.shape[1]:].tolist()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smollm2-135m-instruct")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--train-batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--gen-batches", type=int, default=2)
    parser.add_argument("--gen-batch-size", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS),
                        help="which to time (fp32, the baseline, always is)")
    args = parser.parse_args()
    contenders = ("fp32", *[c for c in CONTENDERS if c in args.contenders and c != "fp32"])
    warnings.filterwarnings("ignore")

    import torch

    from clbench.engine.precision import cpu_bf16_units
    from clbench.results.assemble import cpu_identity

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    fp32, tokenizer = load(args.preset)
    models = {name: fp32 if name == "fp32" else bf16_base(fp32) if name == "bf16-base" else copy.deepcopy(fp32)
              for name in contenders}
    gen_models = {name: copy.deepcopy(models[name]) for name in contenders
                  if name != "fp32-answer-logits"}  # untrained, so their outputs are comparable
    optimizers = {name: torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3)
                  for name, m in models.items()}
    train_loader = batches(tokenizer, args.batch_size, args.train_batches, train=True)
    gen_loader = batches(tokenizer, args.gen_batch_size, args.gen_batches, train=False)
    samples = sum(len(b["input_ids"]) for b in train_loader)
    tokens = sum(len(b["input_ids"]) for b in gen_loader) * args.new_tokens
    cpu = cpu_identity()
    print(f"CPU {cpu['model']} ({cpu['isa']}), bf16 units: {'yes' if cpu_bf16_units() else 'no'}, "
          f"{args.threads} thread(s); {samples} training samples and {tokens} generated tokens per round")

    first_loss, outputs = {}, {}
    times = {name: {"train": [], "gen": []} for name in contenders}
    for r in range(args.rounds):
        order = contenders[r % len(contenders):] + contenders[: r % len(contenders)]
        for name in order:
            start = time.perf_counter()
            losses = train(models[name], name, train_loader, optimizers[name])
            times[name]["train"].append(time.perf_counter() - start)
            first_loss.setdefault(name, losses[0])
            if name == "fp32-answer-logits":  # generation keeps the last position's logits anyway
                continue
            start = time.perf_counter()
            outputs[name] = generate(gen_models[name], name, gen_loader, args.new_tokens, tokenizer)
            times[name]["gen"].append(time.perf_counter() - start)
        print(f"round {r + 1}: " + ", ".join(f"{n} train {times[n]['train'][-1]:.1f}s" for n in contenders), flush=True)

    base = {k: statistics.median(times["fp32"][k]) for k in ("train", "gen")}
    print("\n| contender | training samples/s | x fp32 | generated tokens/s | x fp32 | greedy rows = fp32 "
          "| first loss - fp32 |")
    print("|---|---|---|---|---|---|---|")
    for name in contenders:
        train_s = statistics.median(times[name]["train"])
        row = f"| {name} | {samples / train_s:.2f} | {base['train'] / train_s:.2f} | "
        if times[name]["gen"]:
            gen_s = statistics.median(times[name]["gen"])
            same = sum(a == b for a, b in zip(outputs[name], outputs["fp32"]))
            row += f"{tokens / gen_s:.2f} | {base['gen'] / gen_s:.2f} | {same}/{len(outputs['fp32'])} | "
        else:
            row += "(fp32's) | | | "
        print(row + f"{first_loss[name] - first_loss['fp32']:+.4f} |")


if __name__ == "__main__":
    main()
