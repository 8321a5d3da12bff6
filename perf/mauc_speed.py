"""MAUC speed: clbench's vectorised Hand & Till against scikit-learn's pairwise loop.

    python perf/mauc_speed.py                  # N = 200,000 samples, K = 65 classes
    python perf/mauc_speed.py --n 20000 --k 10 --repeats 5

Prints the time of ``clbench.metrics.functional.multiclass_mauc``, of the ``MulticlassMAUC``
metric (batched updates + compute), and of ``sklearn.metrics.roc_auc_score(multi_class="ovo",
average="macro")`` on the same random probabilities, the speed-up, and the difference between
the values. Exits 1 if the values differ by more than 1e-6.

The probabilities are float32 by default, the dtype the metric stores; scikit-learn gets the
same values as float64, so all three rank identical numbers (``--dtype float64`` for doubles).
Float32 softmax outputs tie across samples, so the tie handling is part of what is timed.
Both sides run on one thread by default (scikit-learn's pairwise loop is single-threaded), so
the ratio measures the algorithm, not the core count. On a machine with more runnable
processes than cores, more torch threads can be much slower: every parallel operation waits
for its slowest thread; the printed load average shows whether that was the case.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _best_time(fn, repeats: int) -> tuple[float, float]:
    best, value = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return best, float(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000, help="samples (default 200000)")
    parser.add_argument("--k", type=int, default=65, help="classes (default 65)")
    parser.add_argument("--repeats", type=int, default=3, help="clbench timings: best of R")
    parser.add_argument("--sklearn-repeats", type=int, default=1, help="sklearn: best of R")
    parser.add_argument("--batch", type=int, default=4096, help="metric update batch size")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1, like scikit-learn's loop; 0: torch's "
                             "default)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import numpy as np
    import torch
    from sklearn.metrics import roc_auc_score

    from clbench.metrics import MulticlassMAUC
    from clbench.metrics.functional import multiclass_mauc

    if args.threads:
        torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    target = rng.integers(0, args.k, args.n)
    logits = rng.normal(size=(args.n, args.k)) + 1.0 * np.eye(args.k)[target]
    dtype = getattr(torch, args.dtype)
    probs = torch.tensor(logits).softmax(dim=1).to(dtype)  # rows sum to 1 (to float32 precision)
    probs_np, target_t = probs.double().numpy(), torch.tensor(target)

    multiclass_mauc(probs[:1000], target_t[:1000], args.k, input="probs")   # warm-up

    def functional():
        return multiclass_mauc(probs, target_t, args.k, input="probs")

    def metric():
        m = MulticlassMAUC(args.k, input="probs").set_dtype(dtype)
        for start in range(0, args.n, args.batch):
            m.update(probs[start:start + args.batch], target_t[start:start + args.batch])
        return m.compute()

    def sklearn():
        return roc_auc_score(target, probs_np, multi_class="ovo", average="macro")

    t_fun, v_fun = _best_time(functional, args.repeats)
    t_met, v_met = _best_time(metric, args.repeats)
    t_skl, v_skl = _best_time(sklearn, args.sklearn_repeats)
    print(f"MAUC on N={args.n:,} samples, K={args.k} classes, {args.dtype} probabilities "
          f"(torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f})")
    print(f"  sklearn roc_auc_score(ovo, macro)  {t_skl:9.3f} s   value {v_skl:.12f}")
    print(f"  clbench multiclass_mauc            {t_fun:9.3f} s   value {v_fun:.12f}   "
          f"{t_skl / t_fun:6.1f}x faster")
    print(f"  clbench MulticlassMAUC (metric)    {t_met:9.3f} s   value {v_met:.12f}   "
          f"{t_skl / t_met:6.1f}x faster")
    diff = max(abs(v_fun - v_skl), abs(v_met - v_skl))
    agree = diff <= 1e-6
    print(f"  max |difference| = {diff:.2e}  ({'agree' if agree else 'DISAGREE'} to 1e-6)")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
