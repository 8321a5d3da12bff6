"""``moe-regression``: the synthetic stream of "Theory on Mixture-of-Experts in Continual
Learning" (Li et al.; Definition 1, App. A.2).

There are ``N`` linear ground truths ``w_n in R^d`` in ``K`` clusters, each with a feature
signal ``v_n``. Each round ``t`` draws a task ``n_t`` uniformly and ``s < d`` samples
(overparameterised): one sample is ``v_{n_t}`` (its column is chosen at random) and ``s - 1`` are
``N(0, sigma_t^2 I)``. The labels ``y_t = X_t^T w_{n_t}`` are noise-free. Each round is one
experience, so the runner scores every round.

Choices where the paper leaves room (each says why):

* ``sigma0`` is the standard deviation of the entries of a cluster centre. The Lemma 5 proof
  writes ``N(0, sigma0^2)``; the prose calls it "the variance".
* A cluster's tasks are its centre plus independent ``Unif[-sigma0^1.5/2, sigma0^1.5/2]``
  entries. The paper assumes ``||w_n - w_n'||_inf = O(sigma0^1.5)`` within a cluster but does not
  say how it is built; this bound holds literally. Task ``n`` is in cluster ``n mod K``, the
  paper's ``W_1={1,4}, W_2={2,5}, W_3={3,6}`` for ``N=6``, ``K=3``. With ``K = N`` every task is its
  own cluster (no perturbation).
* ``v_n = signal_scale * w_n`` ("scaled by a constant", A.2). The constant is not given. The
  default ``1 / sigma0`` makes the entries of ``v_n`` unit-scale. The theory takes
  ``||v_n||_inf = O(1)`` while the gaps between ground truths are ``O(sigma0)``, so the constant
  must grow like ``1 / sigma0``. With ``signal_scale = 1`` the gate outputs stay below the
  routing noise ``lam``, and routing is close to random (docs/moe-theory.md gives the figures).
* ``beta_t = 1``. A.2 builds the data without it, and the distribution of ``beta_t`` in
  Definition 1 is not stated.

Inputs and test sets: a sample's input is ``[x (d), xbar_t (d), t]``. Here ``xbar_t`` is the
round's gating input ``sum_i X_{t,i}`` (Eq. 1 routes per task, not per sample), and ``t`` is the
round index. The metrics of Eqs. 14-16 score round ``tau`` with the expert ``m_tau`` that learned
it, and the index lets a model find that expert. Round ``t``'s test set is
``sqrt(d) * e_i, i = 1..d``, labelled by ``w_{n_t}``. Its mean squared error is exactly
``||w - w_{n_t}||^2``, the paper's model error, so the runner's R matrix holds ``E_tau(w_t)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import torch
from pydantic import Field
from torch.utils.data import TensorDataset

from clbench.data.streams import StreamSpec, build_scenario
from clbench.config.validation import ArgumentError

Count = Annotated[int, Field(ge=1)]
Scale = Annotated[float, Field(gt=0)]  # a standard deviation or a scale factor


@dataclass
class SyntheticStream:
    """One draw of the generator: the task pool and ``rounds`` rounds of data."""

    truths: torch.Tensor    # (N, d) ground truths w_n
    signals: torch.Tensor   # (N, d) feature signals v_n
    clusters: torch.Tensor  # (N,) cluster of each task
    tasks: torch.Tensor     # (T,) task n_t of each round
    X: torch.Tensor         # (T, d, s) feature matrices, columns are samples
    y: torch.Tensor         # (T, s) labels X_t^T w_{n_t}


def make_stream(seed: int, rounds: int, num_tasks: int = 6, num_clusters: int = 3, dim: int = 10,
                samples: int = 6, sigma0: float = 0.4, sigma_t: float = 0.1,
                signal_scale: float | None = None) -> SyntheticStream:
    """Draw the pool and every round at once (float64: Eq. 5 inverts ``X^T X``)."""
    if not 1 <= samples < dim:
        raise ArgumentError("benchmark", "samples", f"need 1 <= samples < dim (overparameterised), got "
                            f"samples={samples}, dim={dim}", fix="use e.g. dim: 10, samples: 6")
    if not 1 <= num_clusters <= num_tasks:
        raise ArgumentError("benchmark", "num_clusters", f"need 1 <= num_clusters <= num_tasks, got {num_clusters} "
                            f"and {num_tasks}", fix="use e.g. num_tasks: 6, num_clusters: 3")
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    clusters = torch.arange(num_tasks) % num_clusters
    centres = sigma0 * torch.randn(num_clusters, dim, generator=g, dtype=f64)
    spread = sigma0 ** 1.5 if num_clusters < num_tasks else 0.0
    truths = centres[clusters] + spread * (torch.rand(num_tasks, dim, generator=g, dtype=f64) - 0.5)
    signals = (1.0 / sigma0 if signal_scale is None else signal_scale) * truths
    tasks = torch.randint(num_tasks, (rounds,), generator=g)
    X = sigma_t * torch.randn(rounds, dim, samples, generator=g, dtype=f64)
    where = torch.randint(samples, (rounds,), generator=g)
    X[torch.arange(rounds), :, where] = signals[tasks]
    y = torch.einsum("tds,td->ts", X, truths[tasks])
    return SyntheticStream(truths, signals, clusters, tasks, X, y)


def round_inputs(x: torch.Tensor, xbar: torch.Tensor, t: int) -> torch.Tensor:
    """Rows ``[x, xbar, t]`` (the layout the ``moe_theory`` model reads). They stay float64, so
    the runner sees the same numbers as :func:`clbench.strategies.moe_theory.simulate`."""
    n = x.shape[0]
    return torch.cat([x, xbar.expand(n, -1), torch.full((n, 1), float(t), dtype=x.dtype)], 1)


def moe_regression(rounds: Count = 40, num_tasks: Count = 6, num_clusters: Count = 3, dim: Count = 10,
                   samples: Count = 6, sigma0: Scale = 0.4, sigma_t: Scale = 0.1, signal_scale: Scale | None = None,
                   seed: Annotated[int, Field(ge=0)] | None = 0):
    """One experience per round: ``s`` training samples, and the ``d`` basis test samples that
    score the model error of Eq. 14 (see the module docstring). Counts are >= 1 and scales > 0
    (``sigma0 ** 1.5`` of a negative ``sigma0`` is complex), checked from the signature.

    ``seed`` draws the ground truths and the data; ``None`` takes it from the run's seed (drawn
    from the generator the harness seeds from the run seed before it builds the stream), so the
    seeds of a suite are independent data streams, not one stream with other routing noise."""
    if seed is None:
        seed = int(torch.randint(0, 2**31 - 1, ()).item())
    stream = make_stream(seed, rounds, num_tasks, num_clusters, dim, samples, sigma0, sigma_t, signal_scale)
    basis = math.sqrt(dim) * torch.eye(dim, dtype=torch.float64)
    train, test, names = [], [], []
    for t in range(rounds):
        X, n = stream.X[t], int(stream.tasks[t])
        xbar = X.sum(1)
        train.append(TensorDataset(round_inputs(X.T, xbar, t), stream.y[t]))
        test.append(TensorDataset(round_inputs(basis, xbar, t), basis @ stream.truths[n]))
        names.append(f"t{t:04d}-task{n}")
    spec = StreamSpec(name="moe-regression", input_shape=(2 * dim + 1,), scenario_type="domain-il",
                      objective="regression", synthetic=True,
                      class_names=[f"task{n}" for n in range(num_tasks)])
    return build_scenario(spec, train, test, names, domain_ids=[int(n) for n in stream.tasks], targets=False)


moe_regression.objective = "regression"  # the stream's objective, known before it is built (preflight)
