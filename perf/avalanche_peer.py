"""Peer check: clbench's methods and Avalanche's own strategies, side by side, with an equivalence test.

Both sides train on the same stream object (the suite benchmark's scenario, e.g. clbench's ``fashion-mnist-split``
or ``fashion-mnist-rotated``, which Avalanche consumes as it is), in the default order, with the suite's model,
optimizer (Adam, its state reset at every experience, as clbench does), batch size, epochs, seeds and method
settings. clbench runs each cell through :func:`clbench.api.run`; Avalanche runs the strategy of
``avalanche.training`` named below. The score is the final average accuracy (mean over the test experiences after
the last one, in %). docs/datasets.md shows the tables of all twelve methods and explains their differences.

    OMP_NUM_THREADS=1 python perf/avalanche_peer.py [--suite configs/suites/fashion-mnist-split.yaml]
        [--benchmark split|rotated|CLASS_PATH] [--methods derpp si ...] [--seeds 0 1 2]
        [--args derpp:alpha=0.2,beta=0.5 si:c=100] [--margin 2.0]

Settings, from ``--suite`` (default configs/suites/fashion-mnist-split.yaml, the protocol's): the benchmark (the
suite's first item with that class_path: the class-IL split before the task-IL one) and its ``init_args``; the first
model; training = ``base.train``, with the benchmark's ``train_args`` and then the method's own laid over it; the
method's ``init_args`` from the benchmark's own ``strategies`` list where it has one (the values the validation search
chose), else the suite's (the first item of that name). A method the suite does not list runs with the clbench
strategy's defaults.
``--args METHOD:KEY=VALUE,...`` lays values (numbers, else YAML) over either. The complete arguments, defaults
filled in from the clbench strategy's signature, go to both sides and are printed above the table.

Verdict: for each method, the per-seed differences d = clbench − Avalanche (paired: the same seed on both sides)
get a TOST (two one-sided t-tests, alpha 0.05) of H0: mean d ≤ −M and H0: mean d ≥ M; "equivalent within ±M" when
both are rejected (p, the larger of the two p-values, below alpha), which is when the 90% confidence interval of the
mean difference lies inside (−M, M); else "not established", with that interval. Default M = ``--margin`` 2.0
points, fixed before any run at the protocol: the order of the spread of one method's final accuracy between runs on
the Split leaderboard (standard deviation over its five orders, class-IL: 0.6 to 2.8 points for GDumb, ER-ACE,
iCaRL, DER++, replay and EWC; 5 to 12 for MAS, LwF, SI and A-GEM, whose final rows hinge on a few classes), so a gap
inside it would not change how the leaderboard reads. With three seeds (t at 2 degrees of
freedom: 2.92) the interval is the mean ± 1.69 sd of the differences, so ±2 needs differences both small and
consistent; more seeds narrow it. One seed gives no interval (not established).

Mapping, clbench -> Avalanche 0.6, and what differs:

* ``naive`` -> ``Naive``; ``ewc`` -> ``EWC`` (ewc_lambda, mode; decay_factor = gamma when online); ``replay`` ->
  ``Replay`` (mem_size); ``lwf`` -> ``LwF`` (alpha, temperature); ``agem`` -> ``AGEM`` (patterns_per_exp,
  sample_size); ``gem`` -> ``GEM`` (patterns_per_exp, memory_strength). Differences: docs/datasets.md.
* ``derpp`` -> ``DER`` (mem_size, alpha, beta, batch_size_mem = replay_batch_size, else the batch size): the same
  loss weights and MSE scale (a mean over samples and logits on both sides). Avalanche's memory is class-balanced
  and filled after each experience from all of it (so nothing is replayed during the first), with the logits the
  network gives at the end of that experience, in eval mode, without the training transform; clbench's is a
  reservoir every batch of every epoch passes through, replayed from the second step, holding the logits of the
  step that stored them. Avalanche draws one memory batch for both terms and forwards it concatenated with the
  current batch; clbench draws two independent ones, each with a forward of its own.
* ``er_ace`` -> ``ER_ACE`` (mem_size, batch_size_mem = replay_batch_size, else the batch size; Avalanche's own
  default is 10). Avalanche halves the sum of the two terms (under Adam a constant loss scale changes nothing but
  ε's weight); its memory is class-balanced and takes the whole current experience at its start, so replay batches
  mix current and old classes, and replay starts at the second experience, the first training plain cross-entropy
  over every output; its replay cross-entropy spans every output unit. clbench's reservoir fills online from the
  first step, the incoming loss is masked to the batch's classes in every experience, and the replay loss to the
  classes seen so far.
* ``icarl`` -> ``ICaRL`` (memory_size = mem_size, fixed_memory = True, buffer_transform = None: the stream has no
  augmentation; feature_extractor = the model without its last layer, classifier = that ``nn.Linear``, the same
  modules, so one initialisation). Avalanche keeps ⌈K/t⌉ exemplars per class (clbench ⌊K/t⌋: 167 and 166 at K =
  1000, t = 6); its herding is the original code's iterative argmax (at most 1000 iterations, possibly short of m),
  clbench's Alg. 4 as a distance; its class means average the exemplars' features and their horizontal flips' (for
  4-D inputs: Fashion-MNIST's are 1x28x28), clbench's the exemplars' only; its loss is the BCE averaged over every
  output unit (target 0 for classes not seen yet) and the batch, clbench's summed over the classes seen, averaged
  over the batch. The script gives the scenario the ``n_classes_per_exp`` and ``classes_order`` Avalanche reads
  through ``experience.benchmark`` (set too), from the experiences' classes. Class-IL only, as clbench's icarl.
* ``gdumb`` -> ``GDumb`` (mem_size): both reset to the initial weights at every experience and train on the memory
  alone. Avalanche's memory is a reservoir per class of ⌊K/|Y|⌋ items (the remainder to the first classes), updated
  at each experience's start; clbench's the paper's greedy sampler, fed a seeded random order. On a class-IL stream
  both hold a uniform random subset of each class, so only the draws differ; on a domain-IL one (rotated: every
  class in every experience) the greedy sampler, balanced and full after the first experience, takes no later
  sample, while Avalanche's reservoir spreads each class's quota over all experiences seen.
* ``si`` -> ``SynapticIntelligence`` (si_lambda = 2c: Avalanche's penalty is λ/2 Σ Ω(θ − θ̃)², clbench's c Σ ...;
  eps = xi). Not settable: Avalanche caps Ω at 0.001 from above (``clip_to``, hard-coded in the plugin's
  after_training_exp) and does not floor it at 0; clbench floors it at 0 and has no cap, so wherever clbench's Ω
  exceeds 0.001 Avalanche's penalty is the weaker, and no equivalence is expected unless c is small enough for both
  to stay near naive. Avalanche's ω also takes the gradient of the total loss (the surrogate's pull included),
  clbench's the unregularised one.
* ``mas`` -> ``MAS`` (lambda_reg = mas_lambda). Avalanche keeps a moving average Ω ← αΩ + (1 − α)Ω_new, which no
  fixed α makes a sum; the script sets α = e/(e + 1) and λ = e·mas_lambda before experience e (0-based), a running
  mean times the count, so λΩ = mas_lambda Σ_k Ω_k exactly, clbench's sum. Left: Avalanche's Ω is the mean over
  batches (of the training batch size) of |(1/B) Σ_k g_k|, the gradient of the batch's mean squared output norm,
  in train mode (the same for an MLP without dropout); clbench's the per-sample (1/N) Σ_k |g_k|, never smaller with
  equal batches: a weaker Avalanche penalty wherever samples pull a parameter opposite ways. clbench's ``samples``
  (a subset) has no counterpart and is refused.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import math
import statistics
import tempfile
import warnings
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "configs" / "suites" / "fashion-mnist-split.yaml"
BENCHMARKS = {"split": "fashion-mnist-split", "rotated": "fashion-mnist-rotated"}
METHODS = ("naive", "ewc", "replay", "lwf", "agem", "gem", "derpp", "er_ace", "icarl", "gdumb", "si", "mas")
MARGIN = 2.0  # points of final average accuracy (module docstring: why)
ALPHA = 0.05


def tost(differences, margin: float = MARGIN, alpha: float = ALPHA) -> tuple[float, float, float, str]:
    """TOST on paired differences: ``(low, high, p, verdict)``.

    ``(low, high)``: the (1 − 2·alpha) confidence interval of the mean difference (90% at alpha 0.05); ``p``: the
    larger of the one-sided t-tests' p-values (H0: mean ≤ −margin, H0: mean ≥ margin); verdict "equivalent within
    ±margin" when ``p < alpha`` (the interval inside (−margin, margin)), else "not established". Fewer than two
    differences: no interval, p nan, not established. Identical differences: the interval is that value, p 0 if it
    is inside the margin, 1 if not.
    """
    from scipy import stats

    d = [float(x) for x in differences]
    n = len(d)
    if n < 2:
        return math.nan, math.nan, math.nan, "not established"
    mean = statistics.fmean(d)
    se = statistics.stdev(d) / math.sqrt(n)
    if se == 0:
        low = high = mean
        p = 0.0 if abs(mean) < margin else 1.0
    else:
        df = n - 1
        p_low = float(stats.t.sf((mean + margin) / se, df))    # H0: mean <= -margin
        p_high = float(stats.t.cdf((mean - margin) / se, df))  # H0: mean >= +margin
        p = max(p_low, p_high)
        half = float(stats.t.ppf(1 - alpha, df)) * se
        low, high = mean - half, mean + half
    return low, high, p, (f"equivalent within ±{margin:g}" if p < alpha else "not established")


def _item(item) -> dict:
    return {"class_path": item} if isinstance(item, str) else dict(item)


def suite_settings(path: str | Path = SUITE) -> dict:
    """A suite's settings per benchmark class_path (the first item of each)::

        {"benchmarks": {name: {"init_args", "train", "strategies": {method: {"init_args", "train", "model_args"}}}},
         "model": {"class_path", "init_args"}, "base": {...}}

    ``train``: ``base.train`` with the benchmark's ``train_args`` laid over it (a method's: its own over those);
    ``strategies``: the benchmark's own list where it has one, else the suite's; the first item of a name wins.
    """
    from clbench.config.load import deep_merge

    raw = yaml.safe_load(Path(path).read_text())
    base = raw.get("base") or {}
    benches: dict[str, dict] = {}
    for bench in map(_item, raw["benchmarks"]):
        if bench["class_path"] in benches:
            continue
        train = deep_merge(base.get("train") or {}, bench.get("train_args") or {})
        strategies: dict[str, dict] = {}
        for strat in map(_item, bench.get("strategies") or raw.get("strategies") or []):
            strategies.setdefault(strat["class_path"], {
                "init_args": dict(strat.get("init_args") or {}),
                "train": deep_merge(train, strat.get("train_args") or {}),
                "model_args": dict(strat.get("model_args") or {})})
        benches[bench["class_path"]] = {"init_args": dict(bench.get("init_args") or {}), "train": train,
                                        "strategies": strategies}
    model = _item(raw["models"][0])
    model["init_args"] = dict(model.get("init_args") or {})
    return {"benchmarks": benches, "model": model, "base": base}


def _value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return yaml.safe_load(text)


def parse_overrides(items) -> dict[str, dict]:
    """``["derpp:alpha=0.2,beta=0.5", "si:c=100"]`` -> ``{"derpp": {"alpha": 0.2, "beta": 0.5}, "si": {"c": 100}}``."""
    out: dict[str, dict] = {}
    for item in items or []:
        method, sep, pairs = item.partition(":")
        if not sep or not method:
            raise ValueError(f"--args {item!r}: expected METHOD:KEY=VALUE,...")
        for pair in filter(None, pairs.split(",")):
            key, eq, value = pair.partition("=")
            if not eq or not key:
                raise ValueError(f"--args {item!r}: {pair!r} is not KEY=VALUE")
            out.setdefault(method, {})[key.strip()] = _value(value.strip())
    return out


def strategy_defaults(method: str) -> dict:
    """The clbench strategy's own defaults, by argument name."""
    from clbench import registry

    params = inspect.signature(registry.resolve("strategies", method)).parameters.values()
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def method_settings(settings: dict, benchmark: str, method: str, overrides: dict | None = None) -> dict:
    """What both sides run ``method`` with: complete ``init_args``, ``train``, ``model``, and ``source``."""
    bench = settings["benchmarks"][benchmark]
    listed = bench["strategies"].get(method)
    extra = (overrides or {}).get(method, {})
    args = {**strategy_defaults(method), **(listed["init_args"] if listed else {}), **extra}
    model = dict(settings["model"])
    if listed and listed["model_args"]:
        model["init_args"] = {**model["init_args"], **listed["model_args"]}
    source = ("suite" if listed else "defaults") + (" + --args" if extra else "")
    return {"init_args": args, "train": listed["train"] if listed else bench["train"], "model": model,
            "source": source}


def clbench_final(settings: dict, benchmark: str, method: str, seed: int, overrides: dict | None = None) -> float:
    from clbench.api import run

    chosen = method_settings(settings, benchmark, method, overrides)
    base = {k: v for k, v in settings["base"].items() if k not in ("logging", "train")}
    cfg = {**base, "seed": seed, "order": "default",
           "benchmark": {"class_path": benchmark, "init_args": settings["benchmarks"][benchmark]["init_args"]},
           "model": chosen["model"], "strategy": {"class_path": method, "init_args": chosen["init_args"]},
           "train": chosen["train"], "logging": {"tensorboard": False, "progress": False}}
    with tempfile.TemporaryDirectory() as out:
        result = run(cfg, out)
    return 100 * statistics.fmean(result.r_matrix[-1])


def mas_sum_schedule(mas_lambda: float):
    """A plugin setting Avalanche's MAS to α = e/(e+1), λ = e·mas_lambda before experience e: λΩ = mas_lambda ΣΩ_k."""
    from avalanche.core import SupervisedPlugin
    from avalanche.training.plugins import MASPlugin

    class SumSchedule(SupervisedPlugin):
        experience = 0  # experiences started so far

        def before_training_exp(self, strategy, **kwargs):
            mas = next(p for p in strategy.plugins if isinstance(p, MASPlugin))
            e = self.experience
            mas.alpha, mas._lambda = e / (e + 1), e * mas_lambda
            self.experience += 1

    return SumSchedule()


def collate(batch):
    """default_collate on items whose ints are tensors: the stream's labels are 0-d tensors, those of the
    tensor datasets Avalanche builds (iCaRL's exemplars) ints, and one batch may mix the two."""
    from torch.utils.data import default_collate

    return default_collate([tuple(torch.as_tensor(v) if isinstance(v, int) else v for v in item) for item in batch])


def avalanche_strategy(method: str, args: dict, model, optimizer, common: dict):
    from avalanche import training as av

    def fresh_optimizer(cls):
        class Fresh(cls):  # clbench starts every experience with a new optimizer state
            def make_optimizer(self, **kwargs):
                kwargs["reset_optimizer_state"] = True
                super().make_optimizer(**kwargs)

            def _obtain_common_dataloader_parameters(self, **kwargs):
                return {**super()._obtain_common_dataloader_parameters(**kwargs), "collate_fn": collate}
        return Fresh

    def make(cls, **kwargs):
        return fresh_optimizer(cls)(model=model, optimizer=optimizer, **kwargs, **common)

    memory_batch = args.get("replay_batch_size") or common["train_mb_size"]
    if method == "icarl":
        assert isinstance(model, torch.nn.Sequential) and isinstance(model[-1], torch.nn.Linear), \
            "the peer check splits the model into its layers before the last (features) and the last (classifier)"
        kwargs = {k: v for k, v in common.items() if k != "criterion"}  # ICaRL brings its own loss
        return fresh_optimizer(av.ICaRL)(feature_extractor=model[:-1], classifier=model[-1], optimizer=optimizer,
                                         memory_size=args["mem_size"], buffer_transform=None, fixed_memory=True,
                                         **kwargs)
    if method == "mas" and args.get("samples") is not None:
        raise ValueError("mas: Avalanche's MAS has no counterpart of 'samples' (it uses every training sample)")
    build = {
        "naive": lambda: make(av.Naive),
        "ewc": lambda: make(av.EWC, ewc_lambda=args["ewc_lambda"], mode=args["mode"],
                            decay_factor=args["gamma"] if args["mode"] == "online" else None),
        "replay": lambda: make(av.Replay, mem_size=args["mem_size"]),
        "lwf": lambda: make(av.LwF, alpha=args["alpha"], temperature=args["temperature"]),
        "agem": lambda: make(av.AGEM, patterns_per_exp=args["patterns_per_experience"],
                             sample_size=args["sample_size"]),
        "gem": lambda: make(av.GEM, patterns_per_exp=args["patterns_per_experience"],
                            memory_strength=args["memory_strength"]),
        "derpp": lambda: make(av.DER, mem_size=args["mem_size"], batch_size_mem=memory_batch, alpha=args["alpha"],
                              beta=args["beta"]),
        "er_ace": lambda: make(av.ER_ACE, mem_size=args["mem_size"], batch_size_mem=memory_batch),
        "gdumb": lambda: make(av.GDumb, mem_size=args["mem_size"]),
        "si": lambda: make(av.SynapticIntelligence, si_lambda=2 * args["c"], eps=args["xi"]),
        "mas": lambda: make(av.MAS, lambda_reg=args["mas_lambda"], plugins=[mas_sum_schedule(args["mas_lambda"])]),
    }
    return build[method]()


def build_scenario(settings: dict, benchmark: str):
    """The benchmark's scenario, with the class layout Avalanche's iCaRL reads."""
    from clbench import registry

    scenario = registry.resolve("benchmarks", benchmark)(**settings["benchmarks"][benchmark]["init_args"])
    classes = [list(exp.classes_in_this_experience) for exp in scenario.train_stream]
    if not hasattr(scenario, "n_classes_per_exp"):
        scenario.n_classes_per_exp = [len(c) for c in classes]
    if not hasattr(scenario, "classes_order"):
        scenario.classes_order = [c for cs in classes for c in cs]
    for exp in scenario.train_stream:  # iCaRL reads the layout through experience.benchmark
        exp.benchmark = scenario
    return scenario


def avalanche_final(settings: dict, benchmark: str, method: str, seed: int, overrides: dict | None = None) -> float:
    from avalanche.evaluation.metrics import accuracy_metrics
    from avalanche.training.plugins import EvaluationPlugin

    from clbench import registry

    chosen = method_settings(settings, benchmark, method, overrides)
    torch.manual_seed(seed)
    scenario = build_scenario(settings, benchmark)
    spec = scenario.clbench
    model = registry.resolve("models", chosen["model"]["class_path"])(
        num_classes=spec.num_classes, input_shape=spec.input_shape, **chosen["model"]["init_args"])
    train = chosen["train"]
    opt = train["optimizer"]
    assert opt["class_path"] == "adam", "the peer check builds Adam, as the suite does"
    optimizer = torch.optim.Adam(model.parameters(), **opt.get("init_args", {}))
    common = dict(criterion=torch.nn.CrossEntropyLoss(), train_mb_size=train["batch_size"],
                  train_epochs=train["epochs"], eval_mb_size=256, device="cpu",
                  evaluator=EvaluationPlugin(accuracy_metrics(experience=True), loggers=[]))
    strategy = avalanche_strategy(method, chosen["init_args"], model, optimizer, common)
    for position, exp in enumerate(scenario.train_stream, 1):
        strategy.train(exp, num_workers=0)
        if not all(torch.isfinite(p).all() for p in model.parameters()):
            print(f"  (Avalanche {method}, seed {seed}: non-finite weights after experience {position})", flush=True)
    metrics = strategy.eval(scenario.test_stream, num_workers=0)
    accs = [v for k, v in sorted(metrics.items()) if k.startswith("Top1_Acc_Exp/eval_phase/test_stream")]
    return 100 * statistics.fmean(accs)


def table_row(method: str, seeds, ours, theirs, margin: float, alpha: float = ALPHA) -> str:
    """One markdown row: | method | seeds | clbench | Avalanche | difference (90% CI) | TOST p | verdict |."""
    def show(xs):
        return f"{statistics.fmean(xs):.1f} ± {statistics.stdev(xs) if len(xs) > 1 else 0:.1f}"

    diffs = [a - b for a, b in zip(ours, theirs)]
    low, high, p, verdict = tost(diffs, margin, alpha)
    interval = "" if math.isnan(low) else f" [{low:+.1f}, {high:+.1f}]"
    p_text = "n/a" if math.isnan(p) else f"{p:.3f}"
    return (f"| {method} | {', '.join(map(str, seeds))} | {show(ours)} | {show(theirs)} | "
            f"{statistics.fmean(diffs):+.1f}{interval} | {p_text} | {verdict} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", type=Path, default=SUITE, help="suite YAML the settings come from")
    parser.add_argument("--benchmark", default="split", help="split, rotated, or a benchmark class_path of the suite")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--args", nargs="+", default=[], metavar="METHOD:KEY=VALUE,...",
                        help="arguments laid over the suite's (or the strategy's defaults)")
    parser.add_argument("--margin", type=float, default=MARGIN, help="equivalence margin, accuracy points")
    args = parser.parse_args()
    try:
        overrides = parse_overrides(args.args)
    except ValueError as e:
        parser.error(str(e))
    unknown = sorted(set(overrides) - set(args.methods))
    if unknown:
        parser.error(f"--args names methods not run: {', '.join(unknown)}")
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    warnings.showwarning = lambda *a, **k: None  # Avalanche's deprecation notices turn themselves back on
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    settings = suite_settings(args.suite)
    benchmark = BENCHMARKS.get(args.benchmark, args.benchmark)
    if benchmark not in settings["benchmarks"]:
        parser.error(f"{args.suite} has no benchmark {benchmark} (it has {', '.join(settings['benchmarks'])})")
    if "icarl" in args.methods:
        kind = build_scenario(settings, benchmark).clbench.scenario_type
        if kind != "class-il":
            parser.error(f"icarl runs on class-incremental benchmarks; {benchmark} is {kind}")
    print(f"{benchmark} ({args.suite}), default order, seeds {args.seeds}: final average accuracy (%), "
          f"mean ± sd over seeds; TOST on clbench − Avalanche per seed, margin ±{args.margin:g}, alpha {ALPHA}")
    for method in args.methods:
        chosen = method_settings(settings, benchmark, method, overrides)
        print(f"- {method} ({chosen['source']}): {chosen['init_args']}; train {chosen['train']}")
    print("\n| method | seeds | clbench | Avalanche | difference (90% CI) | TOST p | verdict |\n"
          "|---|---|---|---|---|---|---|")
    per_seed = []
    for method in args.methods:
        ours = [clbench_final(settings, benchmark, method, s, overrides) for s in args.seeds]
        theirs = [avalanche_final(settings, benchmark, method, s, overrides) for s in args.seeds]
        print(table_row(method, args.seeds, ours, theirs, args.margin), flush=True)
        per_seed.append(f"- {method}: " + ", ".join(f"seed {s} {a:.1f} / {b:.1f}"
                                                   for s, a, b in zip(args.seeds, ours, theirs)))
    print("\nPer seed, clbench / Avalanche:\n" + "\n".join(per_seed))


if __name__ == "__main__":
    main()
