"""Peer check: the Fashion-MNIST suite's methods through clbench and through Avalanche's own strategies.

Both sides train on the same stream object (clbench's ``fashion-mnist-split`` or
``fashion-mnist-rotated`` scenario, which Avalanche consumes as it is), in the default order,
with the suite's model (2x400 ReLU MLP), optimizer (Adam, lr 0.001, its state reset at every
experience, as clbench does), batch size, epochs, seeds and method settings
(configs/suites/fashion-mnist.yaml). clbench runs each cell through :func:`clbench.api.run`;
Avalanche runs ``Naive``, ``EWC``, ``Replay``, ``LwF``, ``GEM`` and ``AGEM`` from
``avalanche.training``. The printed table is each method's final average accuracy (mean over
the test experiences after the last one, in %), per side, mean ± standard deviation over the
seeds. docs/datasets.md shows the table and explains the differences.

    OMP_NUM_THREADS=1 python perf/avalanche_peer.py [--benchmark split|rotated] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import warnings
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "configs" / "suites" / "fashion-mnist.yaml"
BENCHMARKS = {"split": "fashion-mnist-split", "rotated": "fashion-mnist-rotated"}
METHODS = ("naive", "ewc", "replay", "lwf", "agem", "gem")


def suite_settings() -> dict:
    """The suite's benchmarks, model, training settings and each method's arguments."""
    raw = yaml.safe_load(SUITE.read_text())
    strategies = {}
    for item in raw["strategies"]:
        name, args = (item, {}) if isinstance(item, str) else (item["class_path"], item.get("init_args") or {})
        strategies.setdefault(name, args)  # the first ewc: separate penalties
    benches = {b["class_path"]: b.get("init_args") or {} for b in raw["benchmarks"]}
    return {"benchmarks": benches, "model": raw["models"][0], "strategies": strategies, "base": raw["base"]}


def clbench_final(settings: dict, benchmark: str, method: str, seed: int) -> float:
    from clbench.api import run

    cfg = {"seed": seed, "order": "default",
           "benchmark": {"class_path": benchmark, "init_args": settings["benchmarks"][benchmark]},
           "model": settings["model"],
           "strategy": {"class_path": method, "init_args": settings["strategies"][method]},
           **{k: v for k, v in settings["base"].items() if k != "logging"},
           "logging": {"tensorboard": False, "progress": False}}
    with tempfile.TemporaryDirectory() as out:
        result = run(cfg, out)
    return 100 * statistics.fmean(result.r_matrix[-1])


def avalanche_strategy(method: str, args: dict, model, optimizer, common: dict):
    from avalanche.training import AGEM, EWC, GEM, LwF, Naive, Replay

    def fresh_optimizer(cls):
        class Fresh(cls):  # clbench starts every experience with a new optimizer state
            def make_optimizer(self, **kwargs):
                kwargs["reset_optimizer_state"] = True
                super().make_optimizer(**kwargs)
        return Fresh

    build = {
        "naive": lambda: fresh_optimizer(Naive)(model=model, optimizer=optimizer, **common),
        "ewc": lambda: fresh_optimizer(EWC)(model=model, optimizer=optimizer, ewc_lambda=args["ewc_lambda"],
                                            mode="separate", **common),
        "replay": lambda: fresh_optimizer(Replay)(model=model, optimizer=optimizer, mem_size=args["mem_size"],
                                                  **common),
        "lwf": lambda: fresh_optimizer(LwF)(model=model, optimizer=optimizer, alpha=args["alpha"],
                                            temperature=args["temperature"], **common),
        "agem": lambda: fresh_optimizer(AGEM)(model=model, optimizer=optimizer,
                                              patterns_per_exp=args["patterns_per_experience"],
                                              sample_size=args["sample_size"], **common),
        "gem": lambda: fresh_optimizer(GEM)(model=model, optimizer=optimizer,
                                            patterns_per_exp=args["patterns_per_experience"],
                                            memory_strength=args["memory_strength"], **common),
    }
    return build[method]()


def avalanche_final(settings: dict, benchmark: str, method: str, seed: int) -> float:
    from avalanche.evaluation.metrics import accuracy_metrics
    from avalanche.training.plugins import EvaluationPlugin

    from clbench.plugins import registry

    torch.manual_seed(seed)
    scenario = registry.resolve("benchmarks", benchmark)(**settings["benchmarks"][benchmark])
    spec = scenario.clbench
    model = registry.resolve("models", settings["model"]["class_path"])(
        num_classes=spec.num_classes, input_shape=spec.input_shape, **settings["model"].get("init_args", {}))
    train = settings["base"]["train"]
    opt = train["optimizer"]
    assert opt["class_path"] == "adam", "the peer check builds Adam, as the suite does"
    optimizer = torch.optim.Adam(model.parameters(), **opt.get("init_args", {}))
    common = dict(criterion=torch.nn.CrossEntropyLoss(), train_mb_size=train["batch_size"],
                  train_epochs=train["epochs"], eval_mb_size=256, device="cpu",
                  evaluator=EvaluationPlugin(accuracy_metrics(experience=True), loggers=[]))
    strategy = avalanche_strategy(method, settings["strategies"][method], model, optimizer, common)
    for exp in scenario.train_stream:
        strategy.train(exp, num_workers=0)
    metrics = strategy.eval(scenario.test_stream, num_workers=0)
    accs = [v for k, v in sorted(metrics.items()) if k.startswith("Top1_Acc_Exp/eval_phase/test_stream")]
    return 100 * statistics.fmean(accs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", choices=sorted(BENCHMARKS), default="split")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    settings = suite_settings()
    benchmark = BENCHMARKS[args.benchmark]
    print(f"{benchmark}, default order, seeds {args.seeds}: final average accuracy (%), mean ± sd over seeds")
    print("| method | clbench | Avalanche | difference |\n|---|---|---|---|")
    for method in args.methods:
        ours = [clbench_final(settings, benchmark, method, s) for s in args.seeds]
        theirs = [avalanche_final(settings, benchmark, method, s) for s in args.seeds]

        def show(xs):
            return f"{statistics.fmean(xs):.1f} ± {statistics.stdev(xs) if len(xs) > 1 else 0:.1f}"

        gap = statistics.fmean(ours) - statistics.fmean(theirs)
        print(f"| {method} | {show(ours)} | {show(theirs)} | {gap:+.1f} |", flush=True)


if __name__ == "__main__":
    main()
