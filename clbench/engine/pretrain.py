"""Optional pretraining on a held-out subset of every experience, before the stream starts.

The thesis's "short pre-train" (seeds_004 sections 3.2 and 7): "take a hold-out subset from all
domains and pretrain a randomly initialized model for some epochs on this subset", the subset
"removed from domain partitions". A run config asks for it with::

    pretrain: {fraction: 0.1, epochs: 7}     # or {samples: 2000, epochs: 7}

Choices the thesis leaves open, and what is done here:

* Size: ``fraction`` of each experience's training set (rounded, at least one sample per
  experience, so every domain is represented), or ``samples`` in total, shared among the
  experiences in proportion to their sizes (App. B's ``num_samples=2000``).
* Which samples: uniformly at random within each experience (so the subset follows each
  experience's class mix), from a generator seeded by the run seed and the experience's name,
  so the same samples are held out whatever the run order. They are removed from the
  experiences before anything else sees them: strategies, the objective's class weights and
  joint training all see the reduced sets, and no sample is trained on twice.
* Training: the union, ``epochs`` epochs, with the run's optimizer and schedule and a plain
  (naive) learner: the continual strategy starts at experience 0. The objective's class weights,
  if any, come from the union's labels.
* Scores: ``r_init`` is the pretrained model's score (the model the stream starts from, as the
  thesis's baselines inherit the pretraining), and ``result.json``'s ``pretrain`` holds the
  subset's size per experience, the untrained model's scores (``r_untrained``) and
  ``r_pretrained`` (= ``r_init``). Reference models start from the pretrained weights too
  (from a plain model's pretraining when the strategy changed the model before training: see
  :meth:`Pretraining.load_into`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from clbench.errors import UserError


def settings(cfg: dict, source: str) -> dict | None:
    """The checked ``pretrain:`` section (None when absent); fails before the stream is built.
    Its rules (exactly one of ``fraction`` in (0, 1) and ``samples`` >= 1, ``epochs`` >= 1) are
    the config's own (:class:`clbench.config.schema.Pretrain`), checked with the rest of it."""
    section = cfg.get("pretrain")
    if section is None:
        return None
    from clbench.config.schema import Pretrain
    from clbench.config.validation import check_fields

    check_fields(section, Pretrain, source, field="pretrain")
    return {**section, "where": f"{source}: pretrain"}


def _shares(sizes: list[int], total: int) -> list[int]:
    """``total`` split in proportion to ``sizes`` (largest remainders), at least 1 each."""
    exact = np.asarray(sizes, dtype=float) * total / sum(sizes)
    counts = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - counts), kind="stable")[: total - counts.sum()]:
        counts[i] += 1
    return [max(1, int(c)) for c in counts]


class Pretraining:
    """The held-out union and how it trains; built by :func:`carve`."""

    def __init__(self, setting: dict, dataset, held_out: list[np.ndarray], sizes: list[int], names: list[str]):
        self.epochs = int(setting["epochs"])
        self.setting = {k: v for k, v in setting.items() if k != "where"}
        self.dataset = dataset
        self.held_out = held_out  # per experience (run order): positions removed from its training set
        self.sizes = sizes        # training set sizes before the carve
        self.names = names
        self.state: dict | None = None  # pretrained weights, kept for reference models

    def _fit(self, parts, model, watch) -> None:
        """Train ``model`` on the union with a plain learner and a Trainer of its own."""
        from clbench.data.streams import Experience
        from clbench.engine.stage import fit_plain
        from clbench.errors import NonFiniteLoss

        # the objective's set-up only (class weights of the union); the model's own per-domain
        # set-up (routing prototypes) is left to the stream's experiences, which name domains
        parts.objective.begin_experience(
            Experience(position=-1, name="pretrain", domain_id=0, classes=[], train=self.dataset, test=None))
        try:
            fit_plain(parts, model, self.dataset, "pretrain", self.epochs, watch=watch)
        except NonFiniteLoss as err:
            raise NonFiniteLoss(f"pretraining diverged: loss became {err.value}", where=parts.source,
                                fix="lower train.optimizer.init_args.lr or pretrain.epochs") from None

    def run(self, parts, watch, r_untrained: list) -> dict[str, Any]:
        """Pretrain the run's model in place (``r_untrained``: its scores before); the record
        for ``result.json``."""
        start = time.perf_counter()
        self._fit(parts, parts.model, watch)
        if parts.config.metrics.reference_models:
            self.state = _whole_state(parts.model)
        return {**self.setting, "samples_total": len(self.dataset),
                "samples": {name: len(idx) for name, idx in zip(self.names, self.held_out)},
                "r_untrained": r_untrained, "seconds": round(time.perf_counter() - start, 3)}

    def load_into(self, parts, model, watch) -> None:
        """Give a reference model (built like the run's, a plain learner's) the pretrained
        weights. Pretraining is repeated once, seeded as the first time, when they are not in
        memory (after a resume) or are not a plain model's: a strategy that changed the model in
        ``adapt_model`` (LoRA adapters, MoE experts) pretrained its own parameterisation, and a reference
        starts from the plainly pretrained model, as it starts from the plain initial one."""
        if self.state is None or self.state.keys() != model.state_dict().keys():
            self._fit(parts, model, watch)
            self.state = _whole_state(model)
        else:
            model.load_state_dict(self.state)


def _whole_state(model) -> dict:
    """A copy of the model's state with whole tensors on every rank (gathered when sharded:
    every rank trains the reference models)."""
    from clbench.models.sharded import full

    return {k: full(v).detach().clone() for k, v in model.state_dict().items()}


def carve(setting: dict | None, experiences: list, seed: int) -> Pretraining | None:
    """Remove the held-out samples from ``experiences`` (in place) and return their union."""
    if setting is None:
        return None
    from clbench.data.datasets import concat, subset
    from clbench.seeding import Seeds

    sizes = [len(exp.train) for exp in experiences]
    if "fraction" in setting:
        counts = [max(1, round(setting["fraction"] * n)) for n in sizes]
    else:
        if setting["samples"] < len(sizes):
            raise UserError(f"{setting['samples']} samples cannot cover {len(sizes)} experiences",
                            where=f"{setting['where']}.samples", fix=f"set samples >= {len(sizes)}")
        counts = _shares(sizes, setting["samples"])
    short = [exp.name for exp, n, k in zip(experiences, sizes, counts) if k >= n]
    if short:
        raise UserError(f"holding out {setting.get('fraction') or setting.get('samples')} leaves no training "
                        f"samples in experience(s) {', '.join(short)}", where=setting["where"],
                        fix="hold out a smaller fraction or fewer samples")
    held, parts = [], []
    for exp, n, k in zip(experiences, sizes, counts):
        rng = np.random.default_rng(Seeds(seed).held_out(exp.name))
        chosen = np.sort(rng.choice(n, size=k, replace=False))
        keep = np.setdiff1d(np.arange(n), chosen)
        parts.append(subset(exp.train, chosen))
        exp.train = subset(exp.train, keep)
        held.append(chosen)
    return Pretraining(setting, concat(parts), held, sizes, [exp.name for exp in experiences])
