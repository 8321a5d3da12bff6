"""Harness overhead: the same naive training through clbench, a plain PyTorch loop and Avalanche.

All three train the same model (same initial weights) on the same stream (clbench's
``digits-domains`` scenario, which Avalanche consumes as it is), with the same optimizer,
epochs and batch size, evaluating on every test experience before training and after each experience (the R matrix
with its untrained row, which forward transfer needs). Everything
runs in one process, after one untimed warm-up, and each contender is timed ``--repeats``
times (the best is reported: the figure least disturbed by the machine's other work).

Prints seconds and the ratios ``clbench / plain`` (target <= 1.15) and
``clbench / avalanche`` (target < 1).

    python perf/naive_overhead.py [--model cnn] [--epochs 3] [--batch-size 64] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import logging
import time
import warnings

import torch
import torch.nn.functional as F


def plain_loop(model, experiences, epochs, batch_size, eval_batch_size, seed):
    """The reference: a hand-written loop over the same loaders."""
    from clbench.data import make_loader

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
        loader = make_loader(exp.train, batch_size, shuffle=True, seed=seed + i)
        model.train()
        for _ in range(epochs):
            for x, y in loader:
                loss = F.cross_entropy(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        rows.append(evaluate())
    return rows


def avalanche_naive(model, scenario, epochs, batch_size, eval_batch_size):
    from avalanche.evaluation.metrics import accuracy_metrics
    from avalanche.training.plugins import EvaluationPlugin
    from avalanche.training.supervised import Naive

    evaluator = EvaluationPlugin(accuracy_metrics(experience=True), loggers=[])
    strategy = Naive(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                     criterion=torch.nn.CrossEntropyLoss(), train_mb_size=batch_size, train_epochs=epochs,
                     eval_mb_size=eval_batch_size, device="cpu", evaluator=evaluator)
    strategy.eval(scenario.test_stream, num_workers=0)  # the untrained model's row
    for exp in scenario.train_stream:
        strategy.train(exp, num_workers=0)
        strategy.eval(scenario.test_stream, num_workers=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn", choices=["mlp", "cnn", "vit"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--eval-batch-size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-avalanche", action="store_true")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads for all three (1: stable figures on a shared CPU)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    from benchmarks.digits import digits_domains
    from clbench.config import resolve_config
    from clbench.models import cnn, mlp, vit
    from clbench.runner import run
    from clbench.streams import ordered_experiences

    cfg = resolve_config({
        "model": args.model, "strategy": "naive",
        "train": {"epochs": args.epochs, "batch_size": args.batch_size, "eval_batch_size": args.eval_batch_size,
                  "optimizer": {"class_path": "adam", "init_args": {"lr": 0.001}}},
        "logging": {"progress": False, "tensorboard": False}})
    scenario = digits_domains()
    experiences = ordered_experiences(scenario, "default")
    factory = {"mlp": mlp, "cnn": cnn, "vit": vit}[args.model]
    torch.manual_seed(0)
    initial = factory(10, (1, 8, 8))

    plain_loop(copy.deepcopy(initial), experiences[:1], 1, args.batch_size, args.eval_batch_size, 0)  # warm-up
    run(resolve_config({**cfg, "train": {**cfg["train"], "epochs": 1}}), None, progress=False)

    times: dict[str, list[float]] = {"plain": [], "clbench": [], "clbench_train_eval": [], "avalanche": []}
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        plain_loop(copy.deepcopy(initial), experiences, args.epochs, args.batch_size, args.eval_batch_size, 0)
        times["plain"].append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        result = run(cfg, None, progress=False)
        times["clbench"].append(time.perf_counter() - t0)
        times["clbench_train_eval"].append(result["compute"]["train_seconds"] + result["compute"]["eval_seconds"])

        if not args.skip_avalanche:
            t0 = time.perf_counter()
            avalanche_naive(copy.deepcopy(initial), scenario, args.epochs, args.batch_size, args.eval_batch_size)
            times["avalanche"].append(time.perf_counter() - t0)

    best = {k: min(v) for k, v in times.items() if v}
    steps = sum(-(-len(e.train) // args.batch_size) for e in experiences) * args.epochs
    print(f"naive on digits-domains, model={args.model}, {len(experiences)} experiences x {args.epochs} epochs, "
          f"batch {args.batch_size} ({steps} steps), evaluation on all {len(experiences)} test sets before and after "
          "each; "
          f"best of {args.repeats}, torch threads={torch.get_num_threads()}")
    for key, value in best.items():
        print(f"  {key:<20} {value:8.3f} s")
    print(f"clbench (train+eval) / plain : {best['clbench_train_eval'] / best['plain']:.3f}   (target <= 1.15)")
    print(f"clbench (whole run)  / plain : {best['clbench'] / best['plain']:.3f}   "
          "(includes building the stream and model)")
    if "avalanche" in best:
        print(f"clbench (whole run)  / avalanche Naive : {best['clbench'] / best['avalanche']:.3f}   (target < 1)")


if __name__ == "__main__":
    main()
