"""GPU figures in one command: every GPU target measured beside its baseline, written as a report.

    python perf/gpu_report.py --out perf/reports/h100              # CUDA: about 8.5 minutes on one H100
    OMP_NUM_THREADS=1 python perf/gpu_report.py --out /tmp/r --device cpu   # the same paths, tiny: < 1 min

Writes ``DIR/gpu_report.md`` and ``DIR/gpu_report.json`` (one record per measurement: name,
value, unit, baseline, ratio, goal, met or the shortfall, peak memory, or a skip reason) and
prints where they are. The report is written again after every part, so a command that is cut
(a lease's time limit, ``timeout``'s SIGTERM) leaves the parts it finished, and the part it was
in is recorded as cut. A new path that fails on the GPU (the static cache, the grouped
dispatch) is recorded as skipped with its error, and its part's other contenders are measured.

GPU time comes in short leases (one command of at most 10 minutes, machine start-up on top), so
the parts run in the order of their value: the training ratios and MFU of full fine-tuning and
LoRA at Qwen3-0.6B size with the mh_moe/loramoe step, then generation, then the trace-mini grid's
estimate of the full TRACE grid, then the rest. ``--budget-s`` (default on CUDA: 500 s, the sum
of :data:`BUDGETS`, which leaves about 40 s of a 9-minute command to install the carried wheels,
import and write; 470 s on one GPU, where the two-GPU part takes no share) is the time for the
chosen parts together, counted from the first part's start; each part gets its share of what is left when it starts (so a part that ends early
leaves its time to the later ones). A part's clock includes building its models, and a part
whose budget runs out records the rounds it measured (at least the untimed warm-up's) and says
so. Run with ``--only``, a part's records replace that part's in an existing report in ``DIR``
and the others are kept.

Every model is built from its architecture with random weights (nothing is downloaded): the
Qwen3-0.6B architecture (``lm_throughput.SIZES``: hidden 1024, 28 layers, 16 heads, 8 KV heads,
head_dim 128, MLP 3072, vocab 151,936, tied embeddings) with the ``trace-mini`` tokenizer, and
timm's ``vit_small_patch16_224``. ``--device cpu`` runs every path at tiny sizes (a 2-layer
Qwen3 of width 64, a 3-block ViT of width 64 on 32 px, a few steps, two trace-mini tasks), in
the same bf16 settings. Under ``--deterministic`` (clbench's default, process-wide) a part that
strict mode refuses is rerun without it, and the report says so.

Parts, each contender beside its baseline in this one process; rounds interleave the
contenders, rotate who goes first, and follow an untimed warm-up round; ratios are taken per
round and their median reported; on CUDA the clock is read after a synchronise:

- ``lm_train``: training tokens/s at seq 2048 in bf16 weights (AdamW states in bf16, no
  autocast) of full fine-tuning (``seq_ft``), LoRA (``seq_lora``, r = 8 on q/v), ``mh_moe``
  (H = 8) and ``loramoe``, the two mixtures as in ``configs/experiments/trace_qwen3_0.6b_*``
  (4 experts, top-1, MLP projections, a rank-8 LoRA's active parameters). clbench: a
  ``ContinualModule`` with the strategy and the causal-LM objective fitted by a Trainer from
  ``make_trainer``, one epoch more per round (as the runner trains a stage: the fit's set-up and
  Lightning's teardown included). Plain: ``lm_throughput.plain_train`` on a copy of the same
  (adapted) model. Goals: clbench/plain time <= 1.05; MFU >= 40% of 989 TFLOP/s, FLOPs from
  ``lm_throughput.train_flops_per_token`` (PaLM's 6N + attention; 4N for a frozen base);
  mh_moe/loramoe step time <= 1.05.
- ``generation``: greedy decoding with the KV cache, 32 left-padded trace-mini prompts a batch,
  ``min_new_tokens`` forced so both sides generate the same count; clbench:
  ``trainer.validate`` (the objective generates, decodes, scores); plain: ``model.generate``.
  Goal clbench/plain <= 1.10 (``lm_throughput``'s target). A third contender decodes with
  ``kv_cache: static`` (on CUDA transformers compiles its decoding step: CUDA graphs); its first
  pass, the compilation, is timed apart, before the rounds, and the rows whose text differs
  from the dynamic cache's are counted. Goal 5,000 tokens/s (10x the H100 report's 538).
- ``teardown``: Lightning's ``Strategy.teardown`` and ``model_to_device`` timed inside real
  stages (a fit and a validate each) of the full fine-tuning module, per stage, for the module
  a run holds (``ContinualModule.resident``: nothing moves) against a TRACE stage's training
  (5,000 samples x 2 epochs at the time per sample measured here, every row 2,048 tokens: a
  long stage, so the share is a lower bound; goal <= 2%), and against Lightning's default
  (weights and optimizer state to the CPU after every call, and back), stages alternating.
- ``vit``: timm ViT-S/16 at 224 px, bf16 autocast (fp32 weights, as ``precision: bf16-mixed``):
  a training step of the dense ViT against ``vit_moe`` (8 experts, top-1, MoE in the last 4
  blocks, experts of the dense MLP's width: equal active parameters) at image and at token
  level, each with the experts looped over (``dispatch: loop``, the default) and in one
  grouped product per matrix (``dispatch: grouped``). Goal moe/dense <= 1.25; MFU with 6N +
  attention per token.
- ``trace_grid``: ``clbench.engine.runner.run`` over three trace-mini tasks for seq_ft, seq_lora,
  o_lora, loramoe, mh_moe, moses with the 0.6B architecture (TRACE's training settings,
  ``precision: bf16-mixed``): wall time per run split into train, generation (evaluation),
  checkpoint and the rest, and from it an estimate of the full TRACE grid (the six methods x 4
  orders, TRACE 5K: 5,000 train and 2,000 test samples a task), its generation at the
  static cache's rate where the generation part measured it (the dynamic cache's otherwise);
  the record's note gives the assumptions.
- ``fsdp``: with two or more GPUs, ``perf/fsdp_vs_ddp.py`` under ``torchrun`` (seq_lora, 0.6B):
  tokens/s and memory per GPU of FSDP2 against DDP. Skipped, with the reason, on one GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import math
import os
import platform
import signal
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling perf scripts

#: Each part's share of the budget on CUDA (seconds, its model builds included), in the order the
#: parts run: most valuable first. The sum is the CUDA default of ``--budget-s``; see the docstring.
BUDGETS = {"lm_train": 150, "generation": 120, "trace_grid": 130, "teardown": 30, "vit": 40, "fsdp": 30}
#: The command this is sized for: one lease command of at most 9 minutes, everything included.
COMMAND_LIMIT_S = 540
PARTS = tuple(BUDGETS)
TWO_GPU_PARTS = ("fsdp",)
PEAK_FLOPS = 989e12  # H100/H200 SXM bf16 dense
REPORT, DATA = "gpu_report.md", "gpu_report.json"
CPU_MFU = " (on the CPU against the GPU's peak: checks the path, means nothing)"
#: TRACE 5K (MoSEs paper, appendix): per task; 8 tasks; the MH-MoE paper's 2 epochs and batch 10.
TRACE_TRAIN, TRACE_TEST, TRACE_TASKS, TRACE_EPOCHS, TRACE_BATCH = 5000, 2000, 8, 2, 10
#: configs/experiments/trace_qwen3_0.6b.yaml's max_new_tokens, averaged over the 8 tasks.
TRACE_NEW_TOKENS = (8 + 8 + 256 + 64 + 8 + 16 + 16 + 192) / 8
GRID = ("seq_ft", "seq_lora", "o_lora", "loramoe", "mh_moe", "moses")

PROFILES = {
    "cuda": {"size": "qwen3-0.6b", "dtype": "bfloat16", "seq_len": 2048, "batch": 4, "steps": 20, "rounds": 5,
             "heads": 8, "gen_batch": 32, "gen_batches": 2, "gen_new": 64, "stages": 3,
             "vit": {"name": "vit_small_patch16_224", "img": 224, "batch": 128, "steps": 10},
             "grid": {"tasks": ["C-STANCE", "FOMC", "ScienceQA"], "n_train": 80, "n_test": 16, "epochs": 2,
                      "batch_size": 10,
                      "eval_batch_size": 32, "max_length": 512, "max_new_tokens": 12}},
    "cpu": {"size": "tiny", "dtype": "bfloat16", "seq_len": 64, "batch": 2, "steps": 2, "rounds": 2,
            "heads": 4, "gen_batch": 4, "gen_batches": 1, "gen_new": 4, "stages": 2,
            "vit": {"name": None, "img": 32, "patch": 8, "embed": 64, "depth": 3, "num_heads": 4, "batch": 4,
                    "steps": 2},
            "grid": {"tasks": ["C-STANCE", "FOMC"], "n_train": 4, "n_test": 2, "epochs": 1, "batch_size": 4,
                     "eval_batch_size": 4, "max_length": 64, "max_new_tokens": 2}},
}


class ReportError(Exception):
    """A bad argument or environment: one line, exit 2."""


@dataclass
class Record:
    """One measurement: its value beside its baseline, the goal, or why it was skipped."""

    part: str
    name: str
    value: float | None
    unit: str
    baseline: float | None = None
    baseline_name: str | None = None
    ratio: float | None = None  # per-round median of contender / baseline (times), or value / baseline
    ratio_rounds: list[float] = field(default_factory=list)
    goal: str | None = None  # e.g. "ratio <= 1.05", "value >= 0.40"
    met: bool | None = None
    shortfall: str | None = None
    peak_memory_mib: float | None = None
    skip: str | None = None
    note: str = ""

    def judge(self) -> "Record":
        """Fill ``met`` and ``shortfall`` from ``goal``."""
        if self.goal is None:
            return self
        what, op, target = self.goal.split()
        got = self.ratio if what == "ratio" else self.value
        if got is None:
            return self
        target = float(target)
        self.met = got <= target if op == "<=" else got >= target
        if not self.met:
            self.shortfall = f"{what} {format_value(got)} {'>' if op == '<=' else '<'} {format_value(target)}"
        return self


def format_value(value) -> str:
    """How the report prints a number (the test compares the markdown with the JSON through it)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return f"{value:.3e}"


class Budget:
    """A part's clock: its seconds start when the part starts (model builds included)."""

    def __init__(self, seconds: float):
        self.seconds, self.start = seconds, time.perf_counter()
        self.ran_out = False

    def used(self) -> float:
        return time.perf_counter() - self.start

    def allows(self, more: float) -> bool:
        ok = self.used() + more <= self.seconds
        self.ran_out |= not ok
        return ok


class Context:
    """What every part gets: the profile, the device, the budget, the records measured so far."""

    def __init__(self, device: str, profile: dict, deterministic: bool, records: list[Record]):
        import torch

        self.torch, self.device, self.p = torch, torch.device(device), profile
        self.cuda = device == "cuda"
        self.deterministic = deterministic
        self.records = records
        self.budget = Budget(math.inf)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def reset_peak(self) -> None:
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats()

    def peak_mib(self) -> float | None:
        return self.torch.cuda.max_memory_allocated() / 2**20 if self.cuda else None

    def allocated(self) -> int:
        return self.torch.cuda.memory_allocated() if self.cuda else 0

    def trainer(self):
        """A Trainer as the runner makes one (``make_trainer``), on this device."""
        from clbench.engine.trainer import make_trainer

        return make_trainer({"trainer": {"accelerator": "gpu" if self.cuda else "cpu", "devices": 1},
                             "train": {"deterministic": self.deterministic}}, "perf/gpu_report.py")

    def mfu(self, tokens_per_s: float, flops_per_token: float) -> float:
        """Against the H100's bf16 peak, on the CPU too (there it only checks the path)."""
        return tokens_per_s * flops_per_token / PEAK_FLOPS


def interleaved(ctx: Context, jobs: dict, rounds: int) -> tuple[list[dict[str, float]], dict[str, float], str]:
    """Time ``jobs`` (name -> callable) in rounds after an untimed warm-up round, rotating who goes
    first, for ``rounds`` rounds or as many as the budget allows (at least the warm-up's, reported
    as such when no other fits). Returns the rounds' times, each job's peak memory (MiB: the most
    allocated during the job beyond what was allocated when it began: a module held on the device
    as a run holds it, like the plain model, does not count its weights), and a note."""
    names = list(jobs)
    timed: list[dict[str, float]] = []
    peaks: dict[str, float] = {}
    note = ""
    for r in range(rounds + 1):
        order = names[r % len(names):] + names[:r % len(names)]
        t_round = time.perf_counter()
        times = {}
        for name in order:
            ctx.sync()
            ctx.reset_peak()
            start = ctx.allocated()
            t0 = time.perf_counter()
            jobs[name]()
            ctx.sync()
            times[name] = time.perf_counter() - t0
            if ctx.cuda:
                peaks[name] = max(peaks.get(name, 0.0), ctx.peak_mib() - start / 2**20)
        if r == 0:
            warmup = times
        else:
            timed.append(times)
        if r < rounds and not ctx.budget.allows(1.2 * (time.perf_counter() - t_round)):
            note = f"budget ran out: {len(timed)} of {rounds} rounds measured"
            break
    if not timed:
        timed, note = [warmup], "budget ran out: only the warm-up round was measured (its times are reported)"
    return timed, peaks, note


def median_ratio(rounds: list[dict[str, float]], a: str, b: str) -> tuple[float, list[float]]:
    ratios = [t[a] / t[b] for t in rounds]
    return statistics.median(ratios), [round(x, 4) for x in ratios]


def median_time(rounds: list[dict[str, float]], name: str) -> float:
    return statistics.median(t[name] for t in rounds)


def first_pass(ctx: Context, fn) -> tuple[float | None, str | None]:
    """Seconds of ``fn()``'s first call (where a compilation happens), or the one line of the
    error that stopped it: a new path that fails on this GPU is then left out of the rounds and
    recorded as skipped, and the part's other contenders are still measured. A refusal of
    deterministic mode is raised on, so that the part reruns without it."""
    ctx.sync()
    start = time.perf_counter()
    try:
        fn()
    except Exception as err:  # a finding for the report, not a reason to lose the part
        if ctx.deterministic and "determinis" in str(err):
            raise
        traceback.print_exc()
        return None, f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
    ctx.sync()
    return time.perf_counter() - start, None


# --- language models ----------------------------------------------------------------------------

class LanguageModel:
    """The randomly initialised Qwen3 of the profile, the causal-LM objective, and trace-mini batches."""

    def __init__(self, ctx: Context, new_tokens: int = 0):
        from clbench.benchmarks.trace_mini import generate
        from clbench.models.lm.causal_lm import hf_causal_lm
        from clbench.seeding import seed_all
        from lm_throughput import SIZES

        p = ctx.p
        seed_all(0)
        self.initial = hf_causal_lm(architecture="qwen3", tokenizer="trace-mini", config=SIZES[p["size"]],
                                    dtype=p["dtype"])
        self.attention = self.initial.config._attn_implementation
        self.objective = self.new_objective(max_length=p["seq_len"], max_new_tokens=new_tokens or 1)
        data = generate(n_train=200, n_eval=0, n_test=50, seed=0)
        self.train_pool = [r for rs in zip(*(d["train"] for d in data.values())) for r in rs]
        self.test_pool = [r for rs in zip(*(d["test"] for d in data.values())) for r in rs]

    def new_objective(self, **init_args):
        """The causal-LM objective with ``init_args``, set up and attached to the initial model."""
        from clbench.data.streams import StreamSpec
        from clbench.objectives.causal_lm import CausalLanguageModeling

        objective = CausalLanguageModeling(**init_args)
        objective.setup(StreamSpec(name="gpu-report", objective="causal_lm"), [])
        objective.attach(self.initial)
        return objective

    def train_loader(self, steps: int, batch: int, seq_len: int):
        from torch.utils.data import DataLoader

        from lm_throughput import long_records

        records = long_records(self.train_pool, self.initial.tokenizer, seq_len, steps * batch)
        collate = self.objective.collate(train=True)
        batches = [collate(records[i * batch:(i + 1) * batch]) for i in range(steps)]
        return DataLoader(batches, batch_size=None), sum(int(b["attention_mask"].sum()) for b in batches)

    def gen_loader(self, batches: int, batch: int):
        from torch.utils.data import DataLoader

        collate = self.objective.collate(train=False)
        pool = self.test_pool
        return DataLoader([collate([pool[(i * batch + k) % len(pool)] for k in range(batch)])
                           for i in range(batches)], batch_size=None)

    def module(self, strategy, lr: float = 1e-4, objective=None):
        import torch

        from clbench.engine.module import ContinualModule
        from clbench.plugins.build import build_optimizer

        # AdamW as a run builds it
        module = ContinualModule(copy.deepcopy(self.initial), strategy, objective or self.objective,
                                 optimizer=lambda params: build_optimizer(torch.optim.AdamW, {"lr": lr}, params),
                                 columns=[None])
        strategy.setup(module, [], 0)
        return module


def lm_strategies(heads: int) -> dict:
    """The four training set-ups: name -> (strategy factory, frozen base)."""
    from clbench.strategies.lora import SeqLoRA
    from clbench.strategies.moe_lora import LoRAMoE, MHMoE
    from clbench.strategies.seq_ft import SeqFT

    mlp = ["gate_proj", "up_proj", "down_proj"]
    return {"full": (SeqFT, False),
            "lora": (lambda: SeqLoRA(r=8, alpha=16.0), True),
            "mh_moe": (lambda: MHMoE(heads=heads, num_experts=4, top_k=1, match_lora_rank=8, alpha=16.0,
                                     target_modules=mlp), True),
            "loramoe": (lambda: LoRAMoE(num_experts=4, top_k=1, match_lora_rank=8, alpha=16.0,
                                        target_modules=mlp), True)}


def part_lm_train(ctx: Context) -> list[Record]:
    from lm_throughput import plain_train, train_flops_per_token

    p, lr = ctx.p, 1e-4
    lm = LanguageModel(ctx)
    loader, tokens = lm.train_loader(p["steps"], p["batch"], p["seq_len"])
    jobs, flops, weights = {}, {}, {}
    held = contextlib.ExitStack()  # each module stays on the device between its fits, as in a run
    for name, (make, frozen) in lm_strategies(p["heads"]).items():
        module = held.enter_context(lm.module(make(), lr).resident())
        plain = copy.deepcopy(module.model).hf.to(ctx.device)
        trainer = ctx.trainer()
        flops[name] = train_flops_per_token(plain, p["seq_len"], frozen_base=frozen)
        weights[name] = sum(t.numel() * t.element_size() for t in plain.parameters()) / 2**20

        def fit(module=module, trainer=trainer):
            trainer.fit_loop.max_epochs = trainer.current_epoch + 1  # one more epoch, as a stage
            trainer.fit(module, loader)

        jobs[f"clbench {name}"] = fit
        jobs[f"plain {name}"] = lambda plain=plain: plain_train(plain, loader, lr, ctx.device)
    with held:
        rounds, peaks, note = interleaved(ctx, jobs, p["rounds"])
    where = (f"{p['steps']} steps x batch {p['batch']} x {p['seq_len']} tokens per round, {p['dtype']} weights, "
             f"attention {lm.attention}")
    records = []
    for name, (_, frozen) in lm_strategies(p["heads"]).items():
        ratio, per_round = median_ratio(rounds, f"clbench {name}", f"plain {name}")
        rate, base = tokens / median_time(rounds, f"clbench {name}"), tokens / median_time(rounds, f"plain {name}")
        records.append(Record("lm_train", f"train tokens/s {name}", rate, "tokens/s", base, "plain transformers loop",
                              ratio, per_round, "ratio <= 1.05", peak_memory_mib=peaks.get(f"clbench {name}"),
                              note=f"{where}; ratio: clbench/plain time (a fit's set-up and teardown included); "
                                   f"peak: clbench's, beyond what was allocated before its fit"
                                   + (f"; plain loop's peak {format_value(peaks[f'plain {name}'] + weights[name])} "
                                      f"MiB with its weights" if ctx.cuda else "") + (f"; {note}" if note else "")
                              ).judge())
        count = f"{'4N (frozen base)' if frozen else '6N'} + attention, {format_value(flops[name] / 1e9)} GFLOP/token"
        mfu = ctx.mfu(rate, flops[name])
        records.append(Record("lm_train", f"MFU {name}", mfu, "fraction of 989 TFLOP/s", ctx.mfu(base, flops[name]),
                              "plain transformers loop", goal="value >= 0.40",
                              note=f"clbench's tokens/s x FLOPs ({count}) / 989e12{CPU_MFU if not ctx.cuda else ''}"
                              ).judge())
    ratio, per_round = median_ratio(rounds, "clbench mh_moe", "clbench loramoe")
    records.append(Record("lm_train", "step time mh_moe / loramoe", median_time(rounds, "clbench mh_moe") / p["steps"],
                          "s/step", median_time(rounds, "clbench loramoe") / p["steps"], "loramoe (clbench)", ratio,
                          per_round, "ratio <= 1.05", peak_memory_mib=peaks.get("clbench mh_moe"),
                          note=f"H = {p['heads']} heads, 4 experts, top-1, rank matched to a rank-8 LoRA; whole "
                               f"fits per step").judge())
    return records


def part_generation(ctx: Context) -> list[Record]:
    from clbench.strategy import Strategy
    from lm_throughput import plain_generate

    p = ctx.p
    lm = LanguageModel(ctx, new_tokens=p["gen_new"])
    lm.initial.hf.generation_config.min_new_tokens = p["gen_new"]  # the same count on both sides
    loader = lm.gen_loader(p["gen_batches"], p["gen_batch"])
    module = lm.module(Strategy())
    static = lm.module(Strategy(), objective=lm.new_objective(max_length=p["seq_len"], max_new_tokens=p["gen_new"],
                                                               kv_cache="static"))
    plain = copy.deepcopy(lm.initial).hf.to(ctx.device)
    trainer = ctx.trainer()
    jobs = {"clbench": lambda: trainer.validate(module, [loader], verbose=False),
            "static": lambda: trainer.validate(static, [loader], verbose=False),
            "plain": lambda: plain_generate(plain, loader, p["gen_new"], ctx.device, lm.initial.tokenizer)}
    with module.resident(), static.resident():  # on the device between passes, as in a run
        first, failed = first_pass(ctx, jobs["static"])  # on CUDA transformers compiles the decoding step here
        if failed:
            del jobs["static"]
        rounds, peaks, note = interleaved(ctx, jobs, p["rounds"])
    tokens = p["gen_batches"] * p["gen_batch"] * p["gen_new"]
    setting = (f"{p['gen_batches']} batches x {p['gen_batch']} left-padded prompts x {p['gen_new']} new tokens, "
               f"attention {lm.attention}; clbench: trainer.validate (generate, decode, score)")
    ratio, per_round = median_ratio(rounds, "clbench", "plain")
    plain_rate = tokens / median_time(rounds, "plain")
    records = [Record("generation", "greedy generation tokens/s", tokens / median_time(rounds, "clbench"), "tokens/s",
                      plain_rate, "model.generate", ratio, per_round, "ratio <= 1.10",
                      peak_memory_mib=peaks.get("clbench"),
                      note=f"{setting}, dynamic KV cache" + (f"; {note}" if note else "")).judge()]
    name = "greedy generation tokens/s, static cache"
    if failed:
        return records + [Record("generation", name, None, "tokens/s", skip=f"error: {failed}")]
    texts = [[r["prediction"] for rows in m.objective._generations.values() for r in rows] for m in (module, static)]
    differ = sum(a != b for a, b in zip(*texts))
    compiled = "the decoding step compiled by transformers" if ctx.cuda else "eager on the CPU"
    static_ratio, static_rounds = median_ratio(rounds, "static", "plain")
    return records + [Record(
        "generation", name, tokens / median_time(rounds, "static"), "tokens/s", plain_rate, "model.generate",
        static_ratio, static_rounds, "value >= 5000", peak_memory_mib=peaks.get("static"),
        note=f"{setting}, kv_cache: static ({compiled}; the first pass, compilation included, took {first:.1f} s); "
             f"rows whose text differs from the dynamic cache's: {differ} of {len(texts[0])}"
             + (f"; {note}" if note else "")).judge()]


def part_teardown(ctx: Context) -> list[Record]:
    """Moves of the module between fits and validates, timed where they happen: Lightning's
    default (a module outside a run) against the module a run holds (``ContinualModule.resident``)."""
    from clbench.strategies.seq_ft import SeqFT

    p = ctx.p
    lm = LanguageModel(ctx, new_tokens=p["gen_new"])
    loader, tokens = lm.train_loader(p["steps"], p["batch"], p["seq_len"])
    gen = lm.gen_loader(1, p["gen_batch"])
    module = lm.module(SeqFT())
    trainer = ctx.trainer()
    strategy = trainer.strategy
    moved = [0.0]

    def timed(method):
        def run(*args, **kwargs):
            ctx.sync()
            t0 = time.perf_counter()
            out = method(*args, **kwargs)
            ctx.sync()
            moved[0] += time.perf_counter() - t0
            return out
        return run

    strategy.teardown, strategy.model_to_device = timed(strategy.teardown), timed(strategy.model_to_device)

    def stage() -> dict:
        moved[0] = 0.0
        ctx.sync()
        t0 = time.perf_counter()
        trainer.fit_loop.max_epochs = trainer.current_epoch + 1
        trainer.fit(module, loader)
        ctx.sync()
        fit_s, fit_moves = time.perf_counter() - t0, moved[0]
        trainer.validate(module, [gen], verbose=False)
        ctx.sync()
        return {"stage": time.perf_counter() - t0, "moves": moved[0], "fit": fit_s - fit_moves}

    ctx.reset_peak()
    ways: dict[str, list[dict]] = {"default": [], "resident": []}
    note = ""
    for way in ways:  # Lightning's default first: a resident module's first fit moves it from the CPU
        with module.resident() if way == "resident" else contextlib.nullcontext():
            for s in range(p["stages"] + 1):  # stage 0: warm-up
                measured = stage()
                if s:
                    ways[way].append(measured)
                if s < p["stages"] and not ctx.budget.allows((1.2 if way == "resident" else 2.4) * measured["stage"]):
                    note += f"; budget ran out: {len(ways[way])} of {p['stages']} {way} stages measured"
                    break
        if not ways[way]:
            ways[way].append(measured)
            note += f"; only the warm-up {way} stage was measured"
    moves = {way: statistics.median(st["moves"] for st in stages) for way, stages in ways.items()}
    step = statistics.median(st["fit"] for st in ways["default"]) / p["steps"]
    trace_stage = step / p["batch"] * TRACE_TRAIN * TRACE_EPOCHS  # per sample, times a TRACE task's samples
    gb = sum(t.numel() * t.element_size() for t in module.parameters()) / 1e9
    stage_s = statistics.median(st["stage"] for st in ways["resident"])
    return [
        Record("teardown", "model/optimizer moves per stage", moves["resident"], "s", trace_stage,
               "a TRACE stage's training", moves["resident"] / trace_stage, goal="ratio <= 0.02",
               peak_memory_mib=ctx.peak_mib(),
               note=f"the module a run holds (ContinualModule.resident): Strategy.teardown and model_to_device, "
                    f"after/before one fit and one validate; TRACE stage = {TRACE_TRAIN} samples x {TRACE_EPOCHS} "
                    f"epochs at this run's {format_value(step)} s per step of {p['batch']} x {p['seq_len']} tokens "
                    f"(full fine-tuning; a lower bound on the share){note}").judge(),
        Record("teardown", "moves per stage, resident / Lightning's default", moves["resident"], "s",
               moves["default"], f"Lightning's teardown (weights {gb:.2f} GB to the CPU, and back)",
               moves["resident"] / moves["default"] if moves["default"] else None,
               note=f"the default's stages, then the resident's, in one process; a resident stage here "
                    f"(fit + validate, {p['steps']} steps) takes {format_value(stage_s)} s"),
    ]


# --- ViT ------------------------------------------------------------------------------------------

def part_vit(ctx: Context) -> list[Record]:
    torch = ctx.torch
    from clbench.models.vision.vit_moe import vit_moe

    v = ctx.p["vit"]
    shape = (3, v["img"], v["img"])
    size = ({"name": v["name"]} if v["name"] else
            {"patch_size": v["patch"], "embed_dim": v["embed"], "depth": v["depth"], "num_heads": v["num_heads"]})
    torch.manual_seed(0)
    models = {"dense": vit_moe(1000, shape, label="ViT", **size)}
    for level, dispatch in (("image", "loop"), ("token", "loop"), ("image", "grouped"), ("token", "grouped")):
        name = f"moe {level}" + (" grouped" if dispatch == "grouped" else "")
        models[name] = vit_moe(1000, shape, num_experts=8, top_k=1, level=level, dispatch=dispatch, **size)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(v["batch"], *shape, generator=gen).to(ctx.device)
    y = torch.randint(0, 1000, (v["batch"],), generator=gen).to(ctx.device)
    jobs = {}
    for name, model in models.items():
        model.to(ctx.device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def steps(model=model, optimizer=optimizer):
            for _ in range(v["steps"]):
                with torch.autocast(ctx.device.type, dtype=torch.bfloat16):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        jobs[name] = steps
    failed = {}  # a grouped dispatch this GPU refuses: recorded, the rest measured
    for name in [n for n in models if n.endswith("grouped")]:
        _, failed[name] = first_pass(ctx, jobs[name])
        if failed[name]:
            del jobs[name], models[name]
    rounds, peaks, note = interleaved(ctx, jobs, ctx.p["rounds"])
    dense = models["dense"]
    tokens = dense.patch_embed.num_patches + dense.num_prefix_tokens
    active = sum(p.numel() for n, p in dense.named_parameters() if n not in ("pos_embed", "cls_token"))
    width, depth = dense.embed_dim, len(dense.blocks)
    flops = 6 * active + 12 * depth * width * tokens  # per token
    images_s = {k: v["batch"] * v["steps"] / median_time(rounds, k) for k in models}
    where = (f"batch {v['batch']} x {v['img']} px ({tokens} tokens), bf16 autocast, "
             f"AdamW; MoE in blocks {models['moe image'].moe_blocks}")
    records = [Record("vit", f"step time vit_moe ({name.split()[1]}, grouped) / dense", None, "s/step",
                      skip=f"error: {error}") for name, error in failed.items() if error]
    for name in models:
        if name == "dense":
            continue
        level, grouped = name.split()[1], name.endswith("grouped")
        how = "dispatch: grouped (one grouped product per matrix)" if grouped else "dispatch: loop (over experts)"
        ratio, per_round = median_ratio(rounds, name, "dense")
        step, dense_step = (median_time(rounds, k) / v["steps"] for k in (name, "dense"))
        records.append(Record("vit", f"step time vit_moe ({level}{', grouped' if grouped else ''}) / dense",
                              step, "s/step", dense_step, "dense ViT", ratio, per_round, "ratio <= 1.25",
                              peak_memory_mib=peaks.get(name),
                              note=f"8 experts, top-1, {level}-level routing, equal active parameters, {how}; {where}"
                                   + (f"; {note}" if note else "")).judge())
    for name in models:
        rate = images_s[name] * tokens
        records.append(Record("vit", f"MFU {name}", ctx.mfu(rate, flops), "fraction of 989 TFLOP/s",
                              peak_memory_mib=peaks.get(name),
                              note=f"{format_value(images_s[name])} images/s; 6N + attention per token "
                                   f"({format_value(flops / 1e9)} GFLOP/token, N = {active / 1e6:.1f}M active)"
                                   f"{CPU_MFU if not ctx.cuda else ''}"))
    return records


# --- the trace-mini grid -------------------------------------------------------------------------

def grid_strategy(name: str, heads: int) -> dict:
    mlp = ["gate_proj", "up_proj", "down_proj"]
    args = {"seq_ft": None,
            "seq_lora": {"r": 8, "alpha": 16},
            "o_lora": {"r": 8, "alpha": 16},
            "loramoe": {"num_experts": 4, "top_k": 1, "match_lora_rank": 8, "alpha": 16, "target_modules": mlp},
            "mh_moe": {"heads": heads, "num_experts": 4, "top_k": 1, "match_lora_rank": 8, "alpha": 16,
                       "target_modules": mlp},
            "moses": {"num_experts": 2, "top_k": 2, "r": 2, "alpha": 8, "density": 0.3, "task_inference": "keys"}}
    return {"class_path": name, **({"init_args": args[name]} if args[name] else {})}


def grid_config(ctx: Context, strategy: str) -> dict:
    from lm_throughput import SIZES

    g = ctx.p["grid"]
    bench = {"n_train": g["n_train"], "n_test": g["n_test"], **({"tasks": g["tasks"]} if g["tasks"] else {})}
    trainer = {"accelerator": "gpu" if ctx.cuda else "cpu", "devices": 1, "precision": "bf16-mixed"}
    return {"seed": 0, "order": "standard",
            "benchmark": {"class_path": "trace-mini", "init_args": bench},
            "model": {"class_path": "hf_causal_lm",
                      "init_args": {"architecture": "qwen3", "tokenizer": "trace-mini", "config": SIZES[ctx.p["size"]],
                                    "attn_implementation": "sdpa"}},
            "objective": {"class_path": "causal_lm",
                          "init_args": {"max_length": g["max_length"], "max_new_tokens": g["max_new_tokens"]}},
            "strategy": grid_strategy(strategy, ctx.p["heads"]),
            "train": {"epochs": g["epochs"], "batch_size": g["batch_size"], "eval_batch_size": g["eval_batch_size"],
                      "deterministic": ctx.deterministic,
                      "optimizer": {"class_path": "adamw", "init_args": {"lr": 1e-4, "weight_decay": 0.01,
                                                                         "betas": [0.9, 0.95], "eps": 1e-6}}},
            "trainer": trainer, "logging": {"tensorboard": False, "progress": False}}


def part_trace_grid(ctx: Context, out: Path) -> list[Record]:
    """Each run through ``clbench.engine.runner.run``; the checkpoint writes are timed by wrapping the
    runner's ``_save_checkpoint`` for the part's duration."""
    import shutil

    from clbench.config.load import resolve_config
    from clbench.engine.runner import ContinualRun, run

    g = ctx.p["grid"]
    tasks = len(g["tasks"]) if g["tasks"] else TRACE_TASKS
    scratch = out / "trace_grid_runs"
    shutil.rmtree(scratch, ignore_errors=True)
    spent = {"checkpoint": 0.0}
    save = ContinualRun._save_checkpoint

    def timed_save(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return save(self, *args, **kwargs)
        finally:
            spent["checkpoint"] += time.perf_counter() - t0

    ContinualRun._save_checkpoint = timed_save
    records, last = [], 0.0
    train_rates = {r.name.removeprefix("train tokens/s "): r.baseline for r in ctx.records
                   if r.part == "lm_train" and r.name.startswith("train tokens/s ") and r.value is not None}
    # the static cache's rate where it was measured (a GPU run would decode with it), else the dynamic one's
    gen_rates = {r.name: r.value for r in ctx.records if r.part == "generation" and r.value is not None}
    gen_name = next((n for n in ("greedy generation tokens/s, static cache", "greedy generation tokens/s")
                     if n in gen_rates), None)
    gen_rate = gen_rates.get(gen_name)
    try:
        for name in GRID:
            if records and not ctx.budget.allows(1.2 * last):
                records.append(Record("trace_grid", f"run {name}", None, "s",
                                      skip="budget ran out before this run (raise --budget-s)"))
                continue
            spent["checkpoint"] = 0.0
            gc.collect()  # the previous run's model
            if ctx.cuda:
                ctx.torch.cuda.empty_cache()
            ctx.reset_peak()
            t0 = time.perf_counter()
            result = run(resolve_config(grid_config(ctx, name), source=f"trace_grid {name}"), scratch / name,
                         progress=False)
            last = time.perf_counter() - t0
            compute = result["compute"]
            train, generation = compute["train_seconds"], compute["eval_seconds"]
            checkpoint = spent["checkpoint"]
            other = compute["wall_seconds"] - train - generation - checkpoint
            # The estimate, per run: training at TRACE's sample-epochs, each row at the 2,048-token
            # cap, at lm_train's plain-loop tokens/s for this kind of model (else the grid's own rate,
            # per sample); generation at TRACE's prompts x new tokens per evaluation; the rest per stage.
            kind = {"seq_ft": "full", "loramoe": "loramoe", "mh_moe": "mh_moe"}.get(name, "lora")
            trace_samples = TRACE_TRAIN * TRACE_TASKS * TRACE_EPOCHS
            if train_rates.get(kind):
                est_train = trace_samples * 2048 / train_rates[kind]
                how_train = f"{trace_samples} sample-epochs x 2,048 tokens at lm_train's {kind} plain rate"
            else:
                est_train = train * trace_samples / (g["n_train"] * tasks * g["epochs"])
                how_train = "the grid's per-sample training time x TRACE's sample-epochs"
            evaluations = tasks + 1  # before training and after each stage
            mini_gen_tokens = evaluations * tasks * g["n_test"] * g["max_new_tokens"]
            trace_gen_tokens = (TRACE_TASKS + 1) * TRACE_TASKS * TRACE_TEST * TRACE_NEW_TOKENS
            est_gen = trace_gen_tokens / gen_rate if gen_rate else generation * trace_gen_tokens / mini_gen_tokens
            est_rest = (checkpoint + max(other, 0.0)) / tasks * TRACE_TASKS
            estimate = est_train + est_gen + est_rest
            records.append(Record(
                "trace_grid", f"run {name}", compute["wall_seconds"], "s", peak_memory_mib=ctx.peak_mib(),
                note=f"train {train:.1f} s, generation {generation:.1f} s, checkpoint {checkpoint:.1f} s, other "
                     f"{other:.1f} s; {tasks} tasks x {g['n_train']} samples x {g['epochs']} epochs; TRACE-5K "
                     f"estimate {estimate / 3600:.2f} h (train {est_train / 3600:.2f} h: {how_train}; generation "
                     f"{est_gen / 3600:.2f} h: {TRACE_TASKS + 1} evaluations x {TRACE_TASKS * TRACE_TEST} prompts x "
                     f"{TRACE_NEW_TOKENS:.0f} new tokens at "
                     f"{f'the generation part ({gen_name})' if gen_rate else 'this run'}'s "
                     f"rate; checkpoint and other per stage as here)"))
            records[-1].estimate_s = estimate
    finally:
        ContinualRun._save_checkpoint = save
        shutil.rmtree(scratch, ignore_errors=True)
    done = [r for r in records if r.value is not None]
    per_order = sum(r.estimate_s for r in done) / len(done) * len(GRID)
    missing = len(GRID) - len(done)
    records.append(Record(
        "trace_grid", "full TRACE grid on one GPU (estimate)", per_order * 4 / 3600, "hours",
        note=f"{len(GRID)} methods x 4 orders x 1 seed on TRACE 5K, from the per-run estimates above"
             + (f"; {missing} run(s) not measured, counted at the mean of the measured" if missing else "")
             + "; training counted at the 2,048-token cap per row (an upper bound), every generation at its task's "
               "max_new_tokens"))
    for r in records:
        r.__dict__.pop("estimate_s", None)
    return records


# --- two GPUs -------------------------------------------------------------------------------------

def part_fsdp(ctx: Context, out: Path) -> list[Record]:
    import subprocess

    gpus = ctx.torch.cuda.device_count() if ctx.cuda else 0
    if gpus < 2:
        reason = (f"needs two GPUs, found {gpus}" if ctx.cuda
                  else "needs two GPUs (the CPU mode does not run it; perf/fsdp_vs_ddp.py checks the path on CPU)")
        return [Record("fsdp", "fsdp vs ddp tokens/s per GPU", None, "tokens/s", skip=reason)]
    figures = out / "fsdp_vs_ddp.json"
    p = ctx.p
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               str(Path(__file__).with_name("fsdp_vs_ddp.py")),
               "--size", p["size"], "--device", "cuda", "--dtype", p["dtype"], "--seq-len", "1024",
               "--batch-size", str(p["batch"]), "--steps", "20", "--rounds", str(p["rounds"]), "--json", str(figures)]
    left = ctx.budget.seconds - ctx.budget.used()
    try:
        subprocess.run(command, check=True, timeout=max(left, 1), env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except subprocess.TimeoutExpired:
        ctx.budget.ran_out = True
        return [Record("fsdp", "fsdp vs ddp tokens/s per GPU", None, "tokens/s",
                       skip=f"budget ran out: torchrun did not finish in {left:.0f} s")]
    f = json.loads(figures.read_text())
    figures.unlink()
    return fsdp_records(f)


def fsdp_records(f: dict) -> list[Record]:
    """The records of ``perf/fsdp_vs_ddp.py --json``'s figures."""
    mib = 1 / 2**20

    def memory(kind: str) -> float:  # resident + step peak (the peak is measured on CUDA only)
        return (f[kind]["resident_bytes"] + (f[kind]["step_peak_bytes"] or 0)) * mib

    return [
        Record("fsdp", "fsdp vs ddp tokens/s per GPU", f["fsdp"]["tokens_per_s"], "tokens/s",
               f["ddp"]["tokens_per_s"], "ddp", statistics.median(f["ratios"]), [round(x, 4) for x in f["ratios"]],
               note=f"seq_lora r=8 on the 0.6B architecture, {f['world']} processes, seq 1024; ratio: fsdp/ddp time"),
        Record("fsdp", "fsdp vs ddp memory per GPU", memory("fsdp"), "MiB", memory("ddp"), "ddp",
               ratio=memory("fsdp") / memory("ddp"),
               note=f"resident (parameters, gradients, optimizer state held by the rank) + step peak; resident "
                    f"fsdp {f['fsdp']['resident_bytes'] * mib:.1f} MiB, ddp {f['ddp']['resident_bytes'] * mib:.1f} "
                    f"MiB"),
    ]


# --- the report ----------------------------------------------------------------------------------

def environment(ctx: Context) -> dict:
    import lightning
    import transformers

    torch = ctx.torch
    cpu = f"cpu ({platform.processor() or platform.machine()})"
    return {"device": torch.cuda.get_device_name() if ctx.cuda else cpu,
            "gpus": torch.cuda.device_count() if ctx.cuda else 0, "torch": torch.__version__,
            "cuda": torch.version.cuda, "transformers": transformers.__version__, "lightning": lightning.__version__,
            "python": platform.python_version(), "torch_threads": torch.get_num_threads(),
            "deterministic": ctx.deterministic, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def markdown(env: dict, parts: dict, records: list[dict]) -> str:
    lines = ["# GPU report", "", "Written by `perf/gpu_report.py`; every model has random weights.", "",
             "| " + " | ".join(env) + " |", "|" + " --- |" * len(env),
             "| " + " | ".join(str(v) for v in env.values()) + " |", ""]
    for part, info in parts.items():
        lines += [f"## {part}", "",
                  f"{info['seconds']:.0f} s of a {info['budget_s']:.0f} s budget"
                  + ("; **the budget ran out** (see the notes)" if info["out_of_budget"] else "")
                  + (f"; **error**: {info['error']}" if info.get("error") else "")
                  + (f"; {info['note']}" if info.get("note") else ""), "",
                  "| measurement | value | unit | baseline | baseline is | ratio | goal | met | peak MiB | note |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in (r for r in records if r["part"] == part):
            met = ("skipped: " + r["skip"] if r["skip"] else "met" if r["met"] else
                   f"not met ({r['shortfall']})" if r["met"] is False else "-")
            per_round = ", ".join(format_value(x) for x in r["ratio_rounds"])
            rounds = f" (per round: {per_round})" if per_round else ""
            lines.append(f"| {r['name']} | {format_value(r['value'])} | {r['unit']} | {format_value(r['baseline'])} | "
                         f"{r['baseline_name'] or '-'} | {format_value(r['ratio'])} | {r['goal'] or '-'} | {met} | "
                         f"{format_value(r['peak_memory_mib'])} | {(r['note'] + rounds).replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


def preflight(chosen: list[str]) -> None:
    """Before anything is measured: clbench installed (its strategies are found by entry point),
    and the modules the chosen parts import present (a GPU image may lack some)."""
    from importlib.metadata import entry_points

    if "seq_ft" not in {e.name for e in entry_points(group="clbench.strategies")}:
        fail("clbench is not installed here (its strategies are registered by entry point); run "
             "`python -m pip install --no-deps --no-build-isolation -e .` in the repository first")
    needs = ["timm", "peft", "transformers", "lightning"]
    if "trace_grid" in chosen:
        needs.append("avalanche.benchmarks.scenarios.dataset_scenario")
    for name in needs:
        try:
            __import__(name)
        except ImportError as err:
            fail(f"{'the trace_grid part' if name.startswith('avalanche') else 'this script'} needs {name}, which "
                 f"does not import here ({err}); carry the missing wheels (docs/performance.md, 'GPU figures') "
                 f"or leave the part out with --only")


def fail(message: str) -> None:
    print(f"clbench: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for gpu_report.md and gpu_report.json")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds for the chosen parts together, from the first part's start (default on CUDA: the "
                             "sum of their shares, 500 s for all, 470 s on one GPU; on CPU: unbounded)")
    parser.add_argument("--only", nargs="+", choices=PARTS, metavar="NAME", help=f"parts to run: {', '.join(PARTS)}")
    parser.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=True,
                        help="torch deterministic algorithms for every part (clbench's default)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        fail(f"--out: {out} is a file; give a folder (it is created if missing)")
    if args.budget_s is not None and args.budget_s <= 0:
        fail(f"--budget-s: must be positive, got {args.budget_s:g}")
    chosen = [p for p in PARTS if p in (args.only or PARTS)]
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # as clbench.engine.runner.run does
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: no CUDA device is visible; use --device cpu for the tiny CPU mode")
    torch.set_num_threads(args.threads)
    import warnings

    warnings.filterwarnings("ignore")
    from clbench.engine.trainer import quiet_lightning

    quiet_lightning()
    torch.use_deterministic_algorithms(args.deterministic)
    preflight(chosen)
    out.mkdir(parents=True, exist_ok=True)
    try:
        previous = json.loads((out / DATA).read_text()) if (out / DATA).is_file() else {}
        previous.get("records", [])
    except (ValueError, AttributeError):
        fail(f"--out: {out / DATA} is not a report this script wrote; give another folder or remove the file")
    kept = [r for r in previous.get("records", []) if r["part"] not in chosen]
    parts = {k: v for k, v in previous.get("parts", {}).items() if k not in chosen}
    # A part that will only record why it cannot run here (two-GPU parts on one GPU) takes no
    # share: on the first H100 lease fsdp's 93 s went unused while lm_train ran out of rounds.
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    shares = {p: 0 if p in TWO_GPU_PARTS and gpus < 2 else BUDGETS[p] for p in chosen}
    # The tiny CPU sizes end long before any budget: without --budget-s they run unbounded.
    total = args.budget_s if args.budget_s is not None else (
        sum(shares.values()) if args.device == "cuda" else math.inf)
    ctx = Context(args.device, PROFILES[args.device], args.deterministic,
                  [Record(**{k: v for k, v in r.items() if k in Record.__dataclass_fields__})
                   for r in previous.get("records", [])])
    runners = {"lm_train": part_lm_train, "generation": part_generation, "teardown": part_teardown,
               "vit": part_vit, "trace_grid": lambda c: part_trace_grid(c, out), "fsdp": lambda c: part_fsdp(c, out)}

    def write() -> None:
        """The report as it stands: written after every part, so a cut command keeps what it finished."""
        env = environment(ctx)
        records = kept + [asdict(r) for part in chosen for r in ctx.records if r.part == part]
        order = {p: i for i, p in enumerate(PARTS)}
        records.sort(key=lambda r: order[r["part"]])
        ordered = dict(sorted(parts.items(), key=lambda kv: order[kv[0]]))
        for name, text in ((DATA, json.dumps({"environment": env, "parts": ordered, "records": records}, indent=1)),
                           (REPORT, markdown(env, ordered, records))):
            (out / f".{name}.tmp").write_text(text + "\n")
            os.replace(out / f".{name}.tmp", out / name)  # whole or not at all, if the command is cut here

    signal.signal(signal.SIGTERM, cut)
    failed, started = False, time.perf_counter()
    for i, part in enumerate(chosen):
        left = total - (time.perf_counter() - started)
        ctx.budget = Budget(max(left, 0.0) * shares[part] / max(sum(shares[p] for p in chosen[i:]), 1))
        error, note = None, None
        try:
            print(f"[gpu_report] {part}: budget {ctx.budget.seconds:.0f} s", flush=True)
            for attempt in (1, 2):
                try:
                    new = runners[part](ctx)
                    break
                except Exception as err:  # a part's failure is a finding: record it, go on with the others
                    traceback.print_exc()
                    error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                    if attempt == 1 and ctx.deterministic and "determinis" in str(err):
                        # A strict-mode refusal on the GPU would cost every later part too: say so, go on without.
                        torch.use_deterministic_algorithms(False)
                        ctx.deterministic, error = False, None
                        note = f"deterministic mode refused an operation ({str(err).splitlines()[0]}); this part " \
                               f"and the later ones ran without it"
                        continue
                    failed, new = True, [Record(part, part, None, "", skip=f"error: {error}")]
                    break
        except Cut:
            # The command's time ran out inside this part: record that, keep what the others measured.
            ctx.records = [r for r in ctx.records if r.part != part]
            ctx.records.append(Record(part, part, None, "", skip=f"cut: the command was stopped (SIGTERM) "
                                                                  f"{ctx.budget.used():.0f} s into this part"))
            for later in chosen[i + 1:]:
                ctx.records = [r for r in ctx.records if r.part != later]
                ctx.records.append(Record(later, later, None, "", skip="not run: the command was stopped before it"))
            parts[part] = {"seconds": round(ctx.budget.used(), 1), "budget_s": round(ctx.budget.seconds, 1),
                           "out_of_budget": True, "error": "cut by SIGTERM", "note": note}
            write()
            print(f"[gpu_report] cut during {part}; partial report: {out / REPORT}", flush=True)
            return 124
        ctx.records = [r for r in ctx.records if r.part != part] + new
        parts[part] = {"seconds": round(ctx.budget.used(), 1), "budget_s": round(ctx.budget.seconds, 1),
                       "out_of_budget": ctx.budget.ran_out, "error": error, "note": note}
        write()
        gc.collect()
        if ctx.cuda:
            torch.cuda.empty_cache()
    print(f"[gpu_report] report: {out / REPORT}\n[gpu_report] figures: {out / DATA}")
    return 1 if failed else 0


class Cut(BaseException):
    """SIGTERM (a lease's limit, ``timeout``) inside a part: not an ``Exception``, so no part swallows it."""


def cut(signum, frame) -> None:
    raise Cut()


if __name__ == "__main__":
    raise SystemExit(main())
