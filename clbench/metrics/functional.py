"""Pure-tensor twins of the clbench metric classes.

Each class in :mod:`clbench.metrics` accumulates sufficient statistics in ``update`` and calls
one of these functions in ``compute``; calling the function on all the data at once gives the
same value, which is what the tests check. Formulas, sources and sign conventions are in
``docs/metrics.md``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

Absent = Literal["ignore", "zero"]
InputKind = Literal["logits", "probs"]

# Elements per block of score columns in the pairwise AUC: bounds peak memory (three int64
# arrays of this size and a bool one, ~100 MB) whatever N and K are.
_AUC_BLOCK_ELEMENTS = 1 << 22


# -- shared input checks -----------------------------------------------------------------
def _check_target(target: Tensor, num_classes: int, n: int | None = None) -> Tensor:
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise ValueError(f"target must hold integer class indices, got dtype {target.dtype}")
    if target.ndim != 1:
        raise ValueError(f"target must have shape (N,), got {tuple(target.shape)}")
    if n is not None and target.shape[0] != n:
        raise ValueError(f"preds has {n} rows but target has {target.shape[0]}")
    if target.numel() and (int(target.min()) < 0 or int(target.max()) >= num_classes):
        raise ValueError(f"target values must lie in [0, {num_classes}), got "
                         f"[{int(target.min())}, {int(target.max())}]")
    return target.long()


def _check_scores(preds: Tensor, num_classes: int) -> None:
    if not preds.is_floating_point():
        raise ValueError(f"preds must be floating-point scores of shape (N, {num_classes}), "
                         f"got dtype {preds.dtype}")
    if preds.ndim != 2 or preds.shape[1] != num_classes:
        raise ValueError(f"preds must have shape (N, {num_classes}), got {tuple(preds.shape)}")


# -- G-mean --------------------------------------------------------------------------------
def predicted_labels(preds: Tensor, target: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """``(labels, target)`` checked, each ``(N,)``: ``preds`` is either scores ``(N, K)`` (logits
    or probabilities; the prediction is the argmax) or predicted labels ``(N,)``. Checked here
    because torchmetrics' own checks pass a target outside ``[0, K)`` on as a reshape error."""
    if preds.is_floating_point():
        _check_scores(preds, num_classes)
        labels = preds.argmax(dim=1)
    else:
        if preds.ndim != 1:
            raise ValueError(f"integer preds must be labels of shape (N,), got {tuple(preds.shape)}")
        labels = preds.long()
    return labels, _check_target(target, num_classes, labels.shape[0])


def class_counts(preds: Tensor, target: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """Per-class ``(correct, support)``: the G-mean's sufficient statistics, the true positives
    and the true positives plus false negatives of torchmetrics' multiclass stat scores."""
    from torchmetrics.functional.classification import multiclass_stat_scores

    labels, target = predicted_labels(preds, target, num_classes)
    tp, _, _, fn, _ = multiclass_stat_scores(labels, target, num_classes, average=None, validate_args=False).unbind(-1)
    return tp, tp + fn


def geometric_mean_compute(correct: Tensor, support: Tensor, absent: Absent = "ignore") -> Tensor:
    """``(prod_c recall_c) ** (1 / K')`` over the classes that count.

    ``absent="ignore"``: a class with no sample in the evaluated data has an undefined recall
    (0/0) and is left out, so K' is the number of classes present. ``absent="zero"``: every one
    of the K classes counts and an absent class has recall 0, which makes G = 0; this is the
    thesis's formula read literally. NaN when no class is present.
    Computed in log space so that 65 small recalls do not underflow.
    """
    if absent not in ("ignore", "zero"):
        raise ValueError(f"absent must be 'ignore' or 'zero', got {absent!r}")
    present = support > 0
    if not bool(present.any()):
        return torch.tensor(float("nan"), dtype=torch.float64, device=support.device)
    if absent == "zero" and not bool(present.all()):
        return torch.tensor(0.0, dtype=torch.float64, device=support.device)
    recall = correct[present].double() / support[present].double()
    if bool((recall == 0).any()):
        return torch.tensor(0.0, dtype=torch.float64, device=support.device)
    return recall.log().mean().exp()


def geometric_mean(preds: Tensor, target: Tensor, num_classes: int, *,
                   absent: Absent = "ignore") -> Tensor:
    """Geometric mean of per-class recalls (Kubat & Matwin 1997; multiclass form as in the thesis)."""
    return geometric_mean_compute(*class_counts(preds, target, num_classes), absent=absent)


# -- MAUC (Hand & Till 2001) ---------------------------------------------------------------
def _to_probs(preds: Tensor, input: InputKind) -> Tensor:
    if input == "logits":
        probs = preds.softmax(dim=1)
        if probs.numel() and bool(torch.isnan(probs).any()):
            raise ValueError("preds contain NaN")
        return probs
    if input == "probs":
        low, high = preds.aminmax() if preds.numel() else (preds.new_zeros(()),) * 2
        if not (float(low) >= 0 and float(high) <= 1):  # also false for NaN
            raise ValueError("preds with input='probs' must be probabilities in [0, 1] "
                             "(pass input='logits' for raw model outputs)")
        return preds
    raise ValueError(f"input must be 'logits' or 'probs', got {input!r}")


def _argsort_rows(values: Tensor) -> Tensor:
    """Row-wise argsort. On CPU this goes through NumPy, whose SIMD quicksort is several times
    faster than ``torch.sort`` there; the order of tied values is irrelevant to the caller."""
    if values.device.type == "cpu":
        import numpy as np

        return torch.from_numpy(np.argsort(values.detach().numpy(), axis=1))
    return torch.argsort(values, dim=1)


def pairwise_auc(probs: Tensor, target: Tensor, num_classes: int) -> Tensor:
    """``A[i, j] = Â(i|j)``: the probability that a random class-i point has a higher p(i|x)
    than a random class-j point, ties counting 1/2. This is the Mann-Whitney form of Hand &
    Till's rank formula ``(S_i - n_i(n_i+1)/2) / (n_i n_j)`` with average ranks for ties.

    No loop over samples or class pairs: each score column is sorted once, a running count of
    class-i points along the sorted column says how many of them lie below every sample, and a
    scatter-add by true class sums these counts for all j at once (O(K N log N) in total). Ties
    are corrected only in columns where a class-i point ties with a point of another class,
    element by element over the tie groups. Sums are exact integers (twice the win count keeps
    halves integral). Columns are processed in blocks to bound memory. Entries whose class i
    or j has no sample are NaN, as is the diagonal.
    """
    _check_scores(probs, num_classes)
    target = _check_target(target, num_classes, probs.shape[0])
    if probs.numel() and bool(torch.isnan(probs).any()):
        raise ValueError("preds contain NaN")
    return _pairwise_auc(probs.detach(), target, num_classes)


def _pairwise_auc(probs: Tensor, target: Tensor, k: int) -> Tensor:
    n_samples, device = probs.shape[0], probs.device
    out = torch.full((k, k), float("nan"), dtype=torch.float64, device=device)
    if n_samples == 0:
        return out
    if probs.dtype in (torch.float16, torch.bfloat16):
        probs = probs.float()                    # exact; NumPy has no bfloat16 to sort
    counts = torch.bincount(target, minlength=k)
    # For a class-j point x in column i, below(x) / at_or_below(x) count the class-i points with
    # a score < / <= p(i|x); then 2 * wins(i over j) = 2 n_i n_j - sum_x (below + at_or_below).
    # Without ties both equal upto(x), the running count of class-i points along the sorted
    # column, so the sum is 2 * upto_sum[i, j]; tie_fix[i, j] adds what ties change.
    upto_sum = torch.zeros((k, k), dtype=torch.int64, device=device)
    tie_fix = torch.zeros((k, k), dtype=torch.int64, device=device)
    block = max(1, _AUC_BLOCK_ELEMENTS // n_samples)
    transposed = probs.T.contiguous()                                     # (K, N): p(i|x)
    for first in range(0, k, block):
        last = min(k, first + block)
        columns = transposed[first:last]
        order = _argsort_rows(columns).to(device)
        label = target.index_select(0, order.reshape(-1)).view_as(order)  # true classes, sorted
        is_own = label == torch.arange(first, last, device=device)[:, None]
        upto = torch.cumsum(is_own, dim=1)
        upto_sum[first:last].scatter_add_(1, label, upto)
        if bool(_rows_with_cross_ties(columns, order, is_own).any()):
            tie_fix[first:last] = _tie_corrections(columns, order, label, is_own, upto, k)
    twice_wins = 2 * counts[:, None] * counts[None, :] - 2 * upto_sum - tie_fix
    pairs = counts[:, None].double() * counts[None, :].double()
    defined = pairs > 0
    out[defined] = twice_wins[defined].double() / (2.0 * pairs[defined])
    out.fill_diagonal_(float("nan"))
    return out


def _rows_with_cross_ties(columns: Tensor, order: Tensor, is_own: Tensor) -> Tensor:
    """Rows where some class-i point ties with a point of another class (only those ties change
    an AUC). Any tie group holding both kinds has such a pair side by side in sorted order, so
    looking at the sorted neighbours of the class-i points (n_i per row, not N) is enough."""
    n = columns.shape[1]
    values, ranks, own = columns.reshape(-1), order.reshape(-1), is_own.reshape(-1)
    at = torch.nonzero(own).flatten()                     # flat (row, sorted position) of own
    rows = at // n
    value = values.take(rows * n + ranks.take(at))
    tied = torch.zeros(columns.shape[0], dtype=torch.bool, device=columns.device)
    for step in (-1, 1):
        pos = at - rows * n + step
        ok = (pos >= 0) & (pos < n)
        nb, r = at[ok] + step, rows[ok]
        hit = (values.take(r * n + ranks.take(nb)) == value[ok]) & ~own.take(nb)
        tied[r[hit]] = True
    return tied


def _tie_corrections(columns: Tensor, order: Tensor, label: Tensor, is_own: Tensor,
                     upto: Tensor, k: int) -> Tensor:
    """``(b, K)`` sums over class-j points of ``below + at_or_below - 2 upto``, which is zero
    outside tie groups. In a group of equal scores, "below" is the count before the group's
    first element and "at or below" the count at its last. Beyond one pass to find the groups,
    only tied elements are visited."""
    ordered = torch.gather(columns, 1, order)
    b, n = ordered.shape
    same_as_next = ordered[:, 1:] == ordered[:, :-1]
    in_group = torch.zeros_like(is_own)
    in_group[:, 1:] |= same_as_next
    in_group[:, :-1] |= same_as_next
    at = torch.nonzero(in_group.reshape(-1)).flatten()   # flat positions, row-major
    rows, pos = at // n, at % n
    continues = torch.zeros_like(at, dtype=torch.bool)
    inner = pos > 0
    continues[inner] = same_as_next.reshape(-1).take(rows[inner] * (n - 1) + pos[inner] - 1)
    starts = ~continues
    ends = torch.ones_like(starts)
    ends[:-1] = starts[1:]
    group = torch.cumsum(starts, 0) - 1
    upto_at = upto.reshape(-1).take(at)
    before_at = upto_at - is_own.reshape(-1).take(at).long()
    change = before_at[starts][group] + upto_at[ends][group] - 2 * upto_at
    fix = torch.zeros((b, k), dtype=torch.int64, device=columns.device)
    fix.view(-1).index_add_(0, rows * k + label.reshape(-1).take(at), change)
    return fix


def multiclass_mauc_compute(probs: Tensor, target: Tensor, num_classes: int) -> Tensor:
    """Hand & Till's M: the mean over class pairs {i, j} of (Â(i|j) + Â(j|i)) / 2.

    Only pairs whose two classes both occur in ``target`` are averaged (an AUC needs points of
    both classes); this is what scikit-learn's ``roc_auc_score(multi_class="ovo")`` does too.
    NaN when fewer than two classes are present.
    """
    auc = _pairwise_auc(probs, target.long(), num_classes)
    present = torch.bincount(target.long(), minlength=num_classes) > 0
    idx = torch.nonzero(present).flatten()
    if idx.numel() < 2:
        return torch.tensor(float("nan"), dtype=torch.float64, device=probs.device)
    sub = auc[idx][:, idx]
    symmetric = (sub + sub.T) / 2
    upper = torch.triu(torch.ones_like(symmetric, dtype=torch.bool), diagonal=1)
    return symmetric[upper].mean()


def multiclass_mauc(preds: Tensor, target: Tensor, num_classes: int, *,
                    input: InputKind = "logits") -> Tensor:
    """Hand & Till (2001) multiclass AUC from scores ``(N, K)`` and labels ``(N,)``.

    Hand & Till rank the points by the estimated probability p̂(i|x); the softmax is not monotone
    across samples for a fixed class, so raw logits are converted first (``input="logits"``,
    the default because models emit logits). Pass ``input="probs"`` for probabilities.
    """
    _check_scores(preds, num_classes)
    target = _check_target(target, num_classes, preds.shape[0])
    return multiclass_mauc_compute(_to_probs(preds.detach(), input), target, num_classes)


# -- expert utilization --------------------------------------------------------------------
def routing_update(num_domains: int, num_experts: int, experts: Tensor | None = None,
                   gates: Tensor | None = None, domain: int | Tensor = 0,
                   mask: Tensor | None = None) -> dict[str, Tensor]:
    """Sufficient statistics of one batch of routing decisions.

    A routing unit is whatever the layer routes (a token, a patch, or a whole image).
    ``experts``: integer indices of shape ``(..., k)`` (the last dimension is the top-k choice,
    also for k = 1); each unit adds 1/k to each chosen expert, so a domain's row sums to 1.
    ``gates``: router probabilities ``(..., E)``; when ``experts`` is omitted the argmax of the
    gates is the (top-1) decision. ``domain``: an int for the whole batch, or a tensor with the
    units' leading shape. ``mask``: bool of the units' shape, False for units to skip (padding).
    Returns float64 sums keyed like :class:`~clbench.metrics.ExpertUtilization`'s states.
    """
    if experts is None and gates is None:
        raise ValueError("record routing with experts=, gates= or both")
    if gates is not None:
        if not gates.is_floating_point() or gates.shape[-1] != num_experts:
            raise ValueError(f"gates must be float of shape (..., {num_experts}), "
                             f"got {gates.dtype} {tuple(gates.shape)}")
        gates = gates.detach().reshape(-1, num_experts).double()
    if experts is None:
        experts = gates.argmax(dim=-1, keepdim=True)
    else:
        if experts.is_floating_point() or experts.ndim == 0:
            raise ValueError("experts must be integer indices of shape (..., k)")
        experts = experts.detach().reshape(-1, experts.shape[-1]).long()
    units, top_k = experts.shape
    if gates is not None and gates.shape[0] != units:
        raise ValueError(f"experts describe {units} routing units but gates {gates.shape[0]}")
    if units and (int(experts.min()) < 0 or int(experts.max()) >= num_experts):
        raise ValueError(f"expert indices must lie in [0, {num_experts})")
    device = experts.device
    if isinstance(domain, Tensor):
        domains = domain.detach().to(device).long().reshape(-1)
        if domains.numel() != units:
            raise ValueError(f"domain tensor has {domains.numel()} entries for {units} units")
    else:
        domains = torch.full((units,), int(domain), dtype=torch.long, device=device)
    if units and (int(domains.min()) < 0 or int(domains.max()) >= num_domains):
        raise ValueError(f"domain must lie in [0, {num_domains})")
    keep = None if mask is None else mask.detach().to(device).reshape(-1).bool()
    if keep is not None:
        if keep.numel() != units:
            raise ValueError(f"mask has {keep.numel()} entries for {units} units")
        experts, domains = experts[keep], domains[keep]
        gates = None if gates is None else gates[keep]

    d, e = num_domains, num_experts
    flat = (domains[:, None] * e + experts).reshape(-1)
    counts = torch.bincount(flat, minlength=d * e).double().reshape(d, e) / top_k
    units_per_domain = torch.bincount(domains, minlength=d).double()
    gate_mass = torch.zeros((d, e), dtype=torch.float64, device=device)
    gate_entropy = torch.zeros(d, dtype=torch.float64, device=device)
    gate_units = torch.zeros(d, dtype=torch.float64, device=device)
    if gates is not None:
        gate_mass.index_add_(0, domains, gates)
        gate_entropy.index_add_(0, domains, normalized_entropy(gates, dim=-1))
        gate_units = units_per_domain.clone()
    return {"counts": counts, "units": units_per_domain, "gate_mass": gate_mass,
            "gate_entropy": gate_entropy, "gate_units": gate_units}


def normalized_entropy(p: Tensor, dim: int = -1) -> Tensor:
    """Shannon entropy of a distribution along ``dim`` divided by log(size): 0 = one outcome,
    1 = uniform. ``0 log 0 = 0``; a single-outcome axis (log 1 = 0) gives 0."""
    p = p.double()
    size = p.shape[dim]
    h = torch.special.entr(p).sum(dim=dim)  # -p log p, 0 at p = 0
    return h / math.log(size) if size > 1 else torch.zeros_like(h)


def coefficient_of_variation(load: Tensor, dim: int = -1) -> Tensor:
    """Population std / mean of expert loads along ``dim``: 0 when balanced, sqrt(E-1) when all
    load is on one expert. (LoRAMoE's ``cv_squared`` is the square with an unbiased variance.)
    NaN where the mean is 0."""
    load = load.double()
    mean = load.mean(dim=dim)
    std = load.std(dim=dim, correction=0)
    return torch.where(mean > 0, std / torch.where(mean > 0, mean, torch.ones_like(mean)),
                       torch.full_like(mean, float("nan")))


def mutual_information(joint_counts: Tensor) -> Tensor:
    """I(D; E) in nats from a domain-by-expert count table: 0 when every domain uses experts in
    the same proportions (no specialization or a single shared pattern, e.g. collapse), up to
    min(log D, log E) when each domain has its own experts."""
    joint = joint_counts.double()
    total = joint.sum()
    if float(total) == 0:
        return torch.tensor(float("nan"), dtype=torch.float64, device=joint.device)
    p = joint / total
    outer = p.sum(1, keepdim=True) * p.sum(0, keepdim=True)
    ratio = torch.where(p > 0, p / torch.where(outer > 0, outer, torch.ones_like(outer)),
                        torch.ones_like(p))
    return (p * torch.log(ratio)).sum()


def expert_utilization_compute(counts: Tensor, units: Tensor, gate_mass: Tensor,
                               gate_entropy: Tensor, gate_units: Tensor) -> dict[str, Tensor]:
    """Figures of one MoE layer from its accumulated statistics (see ``ExpertUtilization``).

    ``utilization[d, e]`` = share of domain d's routing units sent to expert e (thesis A.9);
    rows of domains with no units are NaN. ``soft_utilization`` = mean gate probability (NaN
    without gates). ``domain_entropy[d]`` = normalized entropy of row d; ``gate_entropy[d]`` =
    mean normalized entropy of the per-unit gate distribution; ``load_imbalance`` = coefficient
    of variation of the expert loads pooled over domains, ``domain_load_imbalance[d]`` the same
    within domain d; ``mutual_information`` = I(D; E) of the count table in nats.
    """
    nan = float("nan")
    seen = units > 0
    util = torch.full_like(counts, nan)
    util[seen] = counts[seen] / units[seen, None]
    has_gates = gate_units > 0
    soft = torch.full_like(gate_mass, nan)
    soft[has_gates] = gate_mass[has_gates] / gate_units[has_gates, None]
    mean_gate_entropy = torch.full_like(gate_entropy, nan)
    mean_gate_entropy[has_gates] = gate_entropy[has_gates] / gate_units[has_gates]
    domain_entropy = torch.full_like(units, nan)
    domain_entropy[seen] = normalized_entropy(util[seen], dim=-1)
    return {
        "utilization": util,
        "soft_utilization": soft,
        "domain_entropy": domain_entropy,
        "gate_entropy": mean_gate_entropy,
        "load_imbalance": coefficient_of_variation(counts.sum(0)),
        "domain_load_imbalance": coefficient_of_variation(counts, dim=-1),
        "mutual_information": mutual_information(counts),
        "units": units.clone(),
    }
