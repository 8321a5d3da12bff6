"""Model error, forgetting and generalisation error of "Theory on Mixture-of-Experts in
Continual Learning" (Eqs. 14-16), computed from experts and ground truths or from an R matrix.

* ``E_tau(w) = ||w - w_{n_tau}||^2`` is the model error of round ``tau``'s task.
* ``F_t = 1/(t-1) sum_{tau<t} E_tau(w_t^{(m_tau)}) - E_tau(w_tau^{(m_tau)})`` is forgetting. It
  scores each past round with the expert ``m_tau`` that learned it.
* ``G_t = 1/t sum_{tau<=t} E_tau(w_t^{(m_tau)})`` is the overall generalisation error.

:class:`RoundErrors` keeps both as running sums over (expert, task) pairs. A round costs
``O(B M N)``, not ``O(t)``, because every past round with the same expert and task has the same
error. :func:`forgetting_curve` and :func:`generalisation_curve` compute the same figures from an
R matrix whose entry ``R[t][tau]`` is ``E_tau`` after round ``t``. That is what the runner
writes for the ``moe-regression`` stream.
"""

from __future__ import annotations

import torch
from torch import Tensor


def model_errors(experts: Tensor, truths: Tensor) -> Tensor:
    """``||w^{(m)} - w_n||^2`` for every expert and task: ``(B, M, d), (B, N, d) -> (B, M, N)``."""
    return (experts[:, :, None, :] - truths[:, None, :, :]).pow(2).sum(-1)


class RoundErrors:
    """Running ``E_t``, ``F_t`` and ``G_t`` for ``B`` independent runs.

    Call :meth:`update` once per round, after the expert update.
    """

    def __init__(self, truths: Tensor, num_experts: int):
        self.truths = truths  # (B, N, d)
        B, N, _ = truths.shape
        self.pairs = torch.zeros(B, num_experts, N, dtype=truths.dtype)  # rounds per (m_tau, n_tau)
        self.at_training = torch.zeros(B, dtype=truths.dtype)  # sum_tau E_tau(w_tau^{(m_tau)})
        self.t = 0

    def update(self, experts: Tensor, expert: Tensor, task: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Round ``t``'s ``(E_t, F_t, G_t)``, each ``(B,)``. ``F_1`` is 0, an empty mean."""
        self.t += 1
        rows = torch.arange(len(expert))
        errors = model_errors(experts, self.truths)
        now = errors[rows, expert, task]
        self.pairs[rows, expert, task] += 1
        self.at_training += now
        current = (self.pairs * errors).sum((1, 2))  # sum_tau E_tau(w_t^{(m_tau)})
        generalisation = current / self.t
        # the current round contributes E_t - E_t = 0, so including it changes nothing
        forgetting = (current - self.at_training) / max(self.t - 1, 1)
        return now, forgetting, generalisation


def forgetting_curve(r: Tensor) -> Tensor:
    """``F_t`` for every row of an R matrix of model errors (``(T, T)``). ``F_1 = 0``."""
    r = torch.as_tensor(r, dtype=torch.float64)
    T = r.shape[0]
    diag = torch.diagonal(r)
    lower = torch.tril(r - diag[None, :], diagonal=-1)
    counts = torch.arange(T, dtype=r.dtype).clamp(min=1)
    return lower.sum(1) / counts


def generalisation_curve(r: Tensor) -> Tensor:
    """``G_t = mean_{tau <= t} R[t][tau]`` for every row of an R matrix of model errors."""
    r = torch.as_tensor(r, dtype=torch.float64)
    T = r.shape[0]
    return torch.tril(r).sum(1) / torch.arange(1, T + 1, dtype=r.dtype)
