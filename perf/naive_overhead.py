"""Harness overhead: the same naive training through clbench, a plain PyTorch loop and Avalanche.

All three train the same model (same initial weights) on the same stream (clbench's
``digits-domains`` scenario, which Avalanche consumes as it is), with the same optimizer
(re-created per experience), epochs and batch size, and evaluate on every test experience
before training and after each experience (the R matrix with its untrained row, which forward
transfer needs). They read the samples in the same order: each experience's shuffling comes
from a generator seeded as clbench seeds its training loader for that stage. The plain loop
uses clbench's loader itself; Avalanche reads through its own dataset wrappers and loader,
given a sampler with that generator. The R matrices they produce are compared at the end.

Everything runs in one process after one untimed warm-up round. Each round times the three
contenders back to back (their order rotates from round to round), so a ratio compares runs
that saw the same machine load; the per-round ratios and their median are printed.

    python perf/naive_overhead.py [--model cnn] [--epochs 3] [--batch-size 64] [--rounds 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import time
import warnings

import torch
import torch.nn.functional as F


def plain_loop(model, experiences, epochs, batch_size, eval_batch_size, seed):
    """The reference: a hand-written loop over the loaders clbench builds."""
    from clbench.data.datasets import make_loader
    from clbench.seeding import derive

    eval_loaders = [make_loader(e.test, eval_batch_size, shuffle=False) for e in experiences]

    def evaluate():
        model.eval()
        row = []
        with torch.inference_mode():
            for test in eval_loaders:
                correct = total = 0
                for x, y in test:
                    correct += int((model(x).argmax(1) == y).sum())
                    total += len(y)
                row.append(correct / total)
        return row

    rows = [evaluate()]  # the untrained model's row, as clbench records it (for FWT)
    for i, exp in enumerate(experiences):
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)  # fresh per experience, as clbench does
        loader = make_loader(exp.train, batch_size, shuffle=True, seed=derive(seed, "loader", i))
        model.train()
        for _ in range(epochs):
            for x, y in loader:
                loss = F.cross_entropy(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        rows.append(evaluate())
    return rows


def avalanche_naive(model, scenario, epochs, batch_size, eval_batch_size, seed):
    """Avalanche's ``Naive``, with a fresh optimizer state per experience and the training
    order of the other two."""
    from avalanche.evaluation.metrics import accuracy_metrics
    from avalanche.training.plugins import EvaluationPlugin
    from avalanche.training.supervised import Naive
    from torch.utils.data import DataLoader, RandomSampler

    from clbench.seeding import derive

    class SameOrderNaive(Naive):
        def make_optimizer(self, **kwargs):  # Avalanche keeps Adam's moments by default; the others start afresh
            kwargs["reset_optimizer_state"] = True
            super().make_optimizer(**kwargs)

        def make_train_dataloader(self, num_workers=0, **kwargs):
            generator = torch.Generator()
            generator.manual_seed(derive(seed, "loader", self.clock.train_exp_counter))
            self.dataloader = DataLoader(self.adapted_dataset, batch_size=self.train_mb_size,
                                         sampler=RandomSampler(self.adapted_dataset, generator=generator),
                                         num_workers=num_workers)

    evaluator = EvaluationPlugin(accuracy_metrics(experience=True), loggers=[])
    strategy = SameOrderNaive(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                              criterion=torch.nn.CrossEntropyLoss(), train_mb_size=batch_size, train_epochs=epochs,
                              eval_mb_size=eval_batch_size, device="cpu", evaluator=evaluator)

    def row(metrics):
        keys = sorted(k for k in metrics if k.startswith("Top1_Acc_Exp/eval_phase/test_stream"))
        return [metrics[k] for k in keys]

    rows = [row(strategy.eval(scenario.test_stream, num_workers=0))]  # the untrained model's row
    for exp in scenario.train_stream:
        strategy.train(exp, num_workers=0)
        rows.append(row(strategy.eval(scenario.test_stream, num_workers=0)))
    return rows


def max_difference(a, b) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn", choices=["mlp", "cnn", "vit"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--eval-batch-size", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip-avalanche", action="store_true")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads for all three (1: stable figures on a shared CPU)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    from clbench.benchmarks.digits import digits_domains
    from clbench.config.load import resolve_config
    from clbench.models.factories import cnn, mlp, vit
    from clbench.engine.runner import run
    from clbench.seeding import derive, seed_all
    from clbench.data.streams import ordered_experiences

    def config(epochs: int) -> dict:
        return resolve_config({
            "model": args.model, "strategy": "naive",
            "train": {"epochs": epochs, "batch_size": args.batch_size, "eval_batch_size": args.eval_batch_size,
                      "optimizer": {"class_path": "adam", "init_args": {"lr": 0.001}}},
            "logging": {"progress": False, "tensorboard": False}})

    cfg = config(args.epochs)
    seed = cfg["seed"]
    scenario = digits_domains()
    experiences = ordered_experiences(scenario, "default")
    factory = {"mlp": mlp, "cnn": cnn, "vit": vit}[args.model]
    seed_all(derive(seed, "model"))  # the initial weights of clbench's run, built as it builds them
    initial = factory(10, (1, 8, 8))

    def contenders(epochs: int, run_cfg: dict) -> dict:
        """name -> callable returning (seconds by figure, R matrix with its untrained row first)."""
        def plain():
            t0 = time.perf_counter()
            rows = plain_loop(copy.deepcopy(initial), experiences, epochs, args.batch_size, args.eval_batch_size, seed)
            return {"plain": time.perf_counter() - t0}, rows

        def clbench():
            t0 = time.perf_counter()
            result = run(run_cfg, None, progress=False)
            whole = time.perf_counter() - t0
            compute = result["compute"]
            return ({"clbench": whole, "clbench_train_eval": compute["train_seconds"] + compute["eval_seconds"]},
                    [result["r_init"], *result["r_matrix"]])

        def avalanche():
            t0 = time.perf_counter()
            rows = avalanche_naive(copy.deepcopy(initial), scenario, epochs, args.batch_size, args.eval_batch_size,
                                   seed)
            return {"avalanche": time.perf_counter() - t0}, rows

        chosen = {"plain": plain, "clbench": clbench, "avalanche": avalanche}
        if args.skip_avalanche:
            del chosen["avalanche"]
        return chosen

    for job in contenders(1, config(1)).values():  # warm-up: first calls, lazy imports, caches
        job()

    jobs = contenders(args.epochs, cfg)
    names = list(jobs)
    rounds: list[dict[str, float]] = []
    matrices: dict[str, list] = {}
    for i in range(args.rounds):
        times: dict[str, float] = {}
        for name in names[i % len(names):] + names[:i % len(names)]:  # rotate who goes first
            seconds, matrices[name] = jobs[name]()
            times.update(seconds)
        rounds.append(times)

    ratios = {"clbench (train+eval) / plain": ("clbench_train_eval", "plain", "t+e/plain"),
              "clbench (whole run) / plain": ("clbench", "plain", "whole/plain")}
    if "avalanche" in names:
        ratios["clbench (whole run) / Avalanche"] = ("clbench", "avalanche", "whole/avalanche")
    steps = sum(-(-len(e.train) // args.batch_size) for e in experiences) * args.epochs
    print(f"naive on digits-domains, model={args.model}, {len(experiences)} experiences x {args.epochs} epochs, "
          f"batch {args.batch_size} ({steps} steps), evaluation on all {len(experiences)} test sets before training "
          f"and after each experience; {args.rounds} rounds, contenders interleaved; "
          f"torch threads={torch.get_num_threads()}")
    figures = [k for k in ("plain", "clbench_train_eval", "clbench", "avalanche") if k in rounds[0]]
    print(f"{'round':>6}" + "".join(f"{k:>20}" for k in figures) + "".join(f"{c:>17}" for _, _, c in ratios.values()))
    for i, times in enumerate(rounds):
        cells = "".join(f"{times[k]:19.3f}s" for k in figures)
        cells += "".join(f"{times[a] / times[b]:17.3f}" for a, b, _ in ratios.values())
        print(f"{i + 1:>6}{cells}")
    cells = "".join(f"{statistics.median(t[k] for t in rounds):19.3f}s" for k in figures)
    cells += "".join(f"{statistics.median(t[a] / t[b] for t in rounds):17.3f}" for a, b, _ in ratios.values())
    print(f"{'median':>6}{cells}")
    for label, (a, b, _) in ratios.items():
        target = {"clbench (train+eval) / plain": "   (target <= 1.10)",
                  "clbench (whole run) / Avalanche": "   (target < 1)"}.get(label, "   (includes building the stream "
                                                                              "and model)")
        print(f"{label:<34}: median of per-round ratios {statistics.median(t[a] / t[b] for t in rounds):.3f}{target}")
    for name in names[1:]:
        print(f"R matrix (untrained row included), max |{name} - plain| = "
              f"{max_difference(matrices[name], matrices['plain']):.4f}")


if __name__ == "__main__":
    main()
