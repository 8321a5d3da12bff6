"""iCaRL: Incremental Classifier and Representation Learning.

Rebuffi, Kolesnikov, Sperl & Lampert 2017 (CVPR). Three parts, as the paper's Algorithms 1-5:

* Nearest-mean-of-exemplars classification (Alg. 1): a sample goes to the class whose exemplar
  mean is nearest to its feature vector. Features φ(x) are the model's penultimate layer,
  L2-normalised, and every mean is re-normalised (the paper's convention, stated once in its
  Sec. 2.1 and left out of the algorithms' notation).
* Representation update (Alg. 3): training on the union of the experience's data and the stored
  exemplars minimises the sigmoid binary cross-entropy over the classes seen so far, with
  one-hot targets for the experience's classes and, for the older classes, the sigmoid outputs
  of the network as it was before the experience (distillation).
* Exemplar memory of K = ``mem_size`` samples in all: after each experience every seen class
  keeps m = ⌊K / t⌋ (t classes seen; Alg. 2). Old classes keep the first m of their list
  (Alg. 5); new classes get m exemplars by herding (Alg. 4): exemplar k is the sample that
  brings the (re-normalised) mean of exemplars 1..k closest to the class mean. Exemplars are
  stored as (experience position, sample index) pairs.

Features: clbench models are plain modules mapping inputs to logits and expose no feature
method, so φ(x) is read with a forward pre-hook on the classification head, the last
``nn.Linear`` with one output per class (for ``mlp``/``cnn`` the final layer; its input is the
last hidden layer, after ReLU and dropout, which eval mode turns off). A model without one is
refused at set-up.

Evaluation: the plugin API gives ``evaluating(ctx, column)`` around each test batch; inside it
the model's output is replaced (a forward hook on the model) by NME scores: minus the distance
to each class mean, so the argmax is the nearest mean, and the lowest float32 for classes
without exemplars (not seen yet). Accuracy (the
R entry) is exactly the NME classifier's; G-mean is computed on its argmax too; MAUC, which
applies a softmax, sees softmax(−distance): a ranking of the classes by distance, not calibrated
probabilities. The exemplars must exist before the evaluation that follows training, but the
runner evaluates before ``after_experience``; so the first test batch after the weights changed
(an optimizer step sets a flag) herds the experience's exemplars with the network as it is and
computes the means. The selection is only committed to the memory in ``after_experience`` (from
the same computation when no step came between), so a test pass after every epoch
(``train.eval_every_epoch``) scores the NME classifier of that epoch's network. Before any class
is learnt (``r_init``) there is no mean, and the network's own outputs are scored.

Choices where the harness differs from the paper's setting:

* Shared head. The paper's output layer grows with the classes; here one head covers every class
  from the start, and the loss covers only the classes seen so far (Alg. 3's sum over
  y = 1..t): outputs of future classes get no gradient. (Avalanche's implementation instead
  trains all outputs, with target 0 for the classes not seen yet.)
* Loss scale: Alg. 3's sum over classes, averaged (not summed) over the batch, as every loss
  in the harness. The strategy replaces the objective's cross-entropy by it (auxiliary terms
  that layers add to the loss are kept), so ``objective.class_weights`` does not apply.
* Teacher outputs on the fly: the paper stores the old network's outputs before training; they
  are computed per batch on the inputs the student sees (as lwf.py explains). The teacher is the
  network at the start of the experience, which is what a resume restores, so it is not saved.
* Optimisation: the run's optimizer and epochs, which are the suite's and shared by every method
  it compares (the paper, on iCIFAR-100: SGD, lr 2.0 divided by 5 after 7/10 and 9/10 of 70
  epochs, batch 128, weight decay 1e-5).
* Herding never picks a sample twice, ties go to the lowest index, and features are computed on
  the training split as the strategy receives it (its training transform; the built-in image
  streams only rescale), in eval mode. A class that reappears in a later experience is herded
  again from that experience's samples and its stored exemplars.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Annotated

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn
from torch.utils._pytree import tree_map

from clbench import ArgumentError, Strategy, UserError
from clbench.data.datasets import concat, make_loader, targets_of
from clbench.models.routing_channel import paused as routing_paused
from clbench.strategies.replay import memory_dataset

_FEATURE_BATCH = 256  # samples per forward when computing exemplar features (memory only, not results)


def find_head(model: nn.Module, num_classes: int) -> nn.Linear:
    """The classification head: the last ``nn.Linear`` with ``num_classes`` outputs."""
    heads = [m for m in model.modules() if isinstance(m, nn.Linear) and m.out_features == num_classes]
    if not heads:
        raise UserError(f"iCaRL reads features at the input of the classification head, and the model has no "
                        f"nn.Linear with {num_classes} outputs", where="strategy",
                        fix="use a model whose last layer is an nn.Linear over the classes (mlp, cnn, vit)")
    return heads[-1]


def herding(features: torch.Tensor, m: int) -> torch.Tensor:
    """Alg. 4 on L2-normalised ``features`` (n, d): indices of up to ``m`` exemplars, in order.

    Exemplar k minimises ‖μ − normalise(φ(x) + Σ_{j<k} φ(p_j))‖ over the samples not yet
    picked, μ the re-normalised class mean (the 1/k of Alg. 4 vanishes in the normalisation).
    """
    mu = F.normalize(features.mean(0), dim=0)
    total = torch.zeros_like(mu)
    free = torch.ones(len(features), dtype=torch.bool, device=features.device)
    picked = []
    for _ in range(min(m, len(features))):
        distance = (mu - F.normalize(features + total, dim=1)).norm(dim=1)
        distance[~free] = float("inf")
        i = int(torch.argmin(distance))
        picked.append(i)
        free[i] = False
        total = total + features[i]
    return torch.tensor(picked, dtype=torch.long)


def nme_scores(features: torch.Tensor, means: torch.Tensor, classes: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(N, num_classes) scores: −‖φ(x) − μ_y‖ for the classes with a mean, the lowest float elsewhere."""
    f = F.normalize(features.flatten(1).float(), dim=1)
    distance = torch.cdist(f, means.to(f.device), compute_mode="donot_use_mm_for_euclid_dist")
    scores = torch.full((len(f), num_classes), torch.finfo(torch.float32).min, device=f.device)
    scores[:, classes.to(f.device)] = -distance
    return scores


def icarl_loss(logits: torch.Tensor, targets: torch.Tensor, seen: torch.Tensor, old: torch.Tensor,
               teacher_logits: torch.Tensor | None) -> torch.Tensor:
    """Alg. 3: BCE over the ``seen`` classes, one-hot targets, old classes' targets σ(teacher)."""
    logits = logits.float()
    target = F.one_hot(targets, logits.shape[1]).float()
    if teacher_logits is not None and len(old):
        target[:, old] = torch.sigmoid(teacher_logits.float()[:, old])
    bce = F.binary_cross_entropy_with_logits(logits[:, seen], target[:, seen], reduction="none")
    return bce.sum(1).mean()


@torch.no_grad()
def head_features(model: nn.Module, head: nn.Module, dataset, objective, device) -> torch.Tensor:
    """L2-normalised inputs of ``head`` for every sample of ``dataset`` (eval mode, in order)."""
    captured: list[torch.Tensor] = []
    hook = head.register_forward_pre_hook(lambda module, args: captured.append(args[0].detach().flatten(1).float()))
    was_training = model.training
    model.eval()
    try:
        with routing_paused():  # not test units: nothing to record
            for batch in make_loader(dataset, _FEATURE_BATCH, shuffle=False, collate_fn=objective.collate(train=True)):
                inputs, _ = objective.split(batch)
                objective.forward(model, tree_map(lambda t: t.to(device), inputs))
    finally:
        hook.remove()
        model.train(was_training)
    features = torch.cat(captured) if captured else torch.zeros(0, 0)
    if len(features) != len(dataset):
        raise UserError(f"iCaRL read {len(features)} feature vectors for {len(dataset)} samples: the head runs "
                        "more than once per forward", where="strategy", fix="use a model that calls its head once")
    return F.normalize(features, dim=1)


@dataclass
class Classifier:
    """What NME classification needs: every class's exemplars (pairs, herding order) and means."""

    exemplars: dict[int, torch.Tensor]
    classes: torch.Tensor  # classes with at least one exemplar
    means: torch.Tensor    # (len(classes), d), re-normalised


class ICaRL(Strategy):
    """iCaRL.

    Args:
        mem_size: K, exemplars in total over all classes (m = ⌊K / t⌋ per class with t classes
            seen). Default 200, our choice: the budget of ``replay``'s default, so the two
            compare at equal memory (the paper uses K = 2000 on iCIFAR-100 and 20000 on
            ImageNet). It must be at least the number of classes of the stream.
    """

    supports = frozenset({"class-il"})
    requires = frozenset({"classification"})  # class labels, one output per class
    # Herding runs on every rank inside evaluation and relies on bit-identical features there;
    # untested under DDP (a rank-0 selection broadcast to the others would make it safe).
    supports_distributed = False

    def __init__(self, mem_size: Annotated[int, Field(ge=1)] = 200):
        super().__init__()
        self.mem_size = mem_size
        self.exemplars: dict[int, torch.Tensor] = {}  # class -> (m, 2) pairs, herding order
        self.seen_classes: list[int] = []             # classes of the experiences finished
        self.head: nn.Linear | None = None
        self.num_classes = 0
        self.teacher: nn.Module | None = None
        self._teacher_device: torch.device | None = None
        self._current = None                          # the experience being trained
        self._seen = self._old = torch.zeros(0, dtype=torch.long)
        self._classifier: Classifier | None = None
        self._stale = True                            # weights changed since the classifier was built

    def setup(self, ctx, experiences, seed):
        super().setup(ctx, experiences, seed)
        self.num_classes = int(ctx.objective.num_classes)
        self.head = find_head(ctx.model, self.num_classes)
        total = len({c for exp in experiences for c in exp.classes})
        if self.mem_size < total:
            raise ArgumentError("strategy", "mem_size", f"{self.mem_size} exemplars cannot hold one per class of "
                                f"the stream's {total} classes", fix=f"set mem_size to at least {total}")

    # -- training -------------------------------------------------------------------------
    def before_experience(self, ctx, experience):
        self._current = experience
        old = sorted(set(self.seen_classes) - set(experience.classes))
        self._old = torch.tensor(old, dtype=torch.long)
        self._seen = torch.tensor(sorted(set(old) | set(experience.classes)), dtype=torch.long)
        self.teacher = None
        if old:
            self.teacher = copy.deepcopy(ctx.model).eval().requires_grad_(False)
            self._teacher_device = next(self.teacher.parameters()).device
        self._classifier, self._stale = None, True

    def train_dataset(self, experience):
        pairs = self._stored_pairs()
        if not len(pairs):
            return experience.train
        return concat([experience.train, memory_dataset(self.experiences, pairs)])

    def training_loss(self, ctx, x, y, logits, loss):
        teacher_logits = None
        if self.teacher is not None:
            if self._teacher_device != logits.device:
                self.teacher.to(logits.device)
                self._teacher_device = logits.device
            with torch.no_grad(), routing_paused():
                teacher_logits = self.teacher(x)
        seen, old = self._seen.to(logits.device), self._old.to(logits.device)
        task = ctx.objective.loss(logits, y)  # removed, keeping what layers added to it
        return loss - task + icarl_loss(logits, y, seen, old, teacher_logits)

    def after_optimizer_step(self, ctx):
        self._stale = True

    def after_experience(self, ctx, experience):
        classifier = self._build(ctx)
        self.exemplars = classifier.exemplars
        self.seen_classes = sorted(set(self.seen_classes) | set(experience.classes))
        self._current, self.teacher = None, None

    # -- classification -------------------------------------------------------------------
    def evaluating(self, ctx, column):
        classifier = self._build(ctx)
        if not len(classifier.classes):
            return contextlib.nullcontext()  # no class learnt yet: the network's own outputs
        return self._nme(ctx.model, classifier)

    @contextlib.contextmanager
    def _nme(self, model: nn.Module, classifier: Classifier):
        """The model's outputs replaced by NME scores from the head's input."""
        seen: list[torch.Tensor] = []

        def keep(module, args):
            seen.append(args[0])

        def replace(module, args, output):
            return nme_scores(seen.pop(), classifier.means, classifier.classes, self.num_classes)

        handles = [self.head.register_forward_pre_hook(keep), model.register_forward_hook(replace)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _build(self, ctx) -> Classifier:
        """The exemplars and means for the current weights (computed once per weight change)."""
        if self._stale or self._classifier is None:
            model, device = ctx.model, ctx.device
            home = next(model.parameters()).device
            model.to(device)
            try:
                self._classifier = self._select(model, ctx.objective, device)
            finally:
                model.to(home)
            self._stale = False
        return self._classifier

    def _select(self, model, objective, device) -> Classifier:
        """Alg. 2's memory step (reduce old classes, herd new ones) and Alg. 1's means."""
        exp = self._current
        stored = self._stored_pairs()
        parts = [stored] if exp is None else [torch.stack([torch.full((len(exp.train),), exp.position),
                                                           torch.arange(len(exp.train))], dim=1), stored]
        pairs = torch.cat(parts).long()
        if not len(pairs):
            return Classifier({}, torch.zeros(0, dtype=torch.long), torch.zeros(0, 0))
        pairs = pairs[torch.argsort(pairs[:, 0], stable=True)]  # memory_dataset's order
        dataset = memory_dataset(self.experiences, pairs)
        labels = targets_of(dataset).long().cpu()
        features = head_features(model, self.head, dataset, objective, device).cpu()
        row = {tuple(p): r for r, p in enumerate(pairs.tolist())}
        new = set(exp.classes) if exp is not None else set()
        classes = sorted(set(self.exemplars) | new)
        m = self.mem_size // max(len(set(self.seen_classes) | new), 1)
        exemplars: dict[int, torch.Tensor] = {}
        for c in classes:
            if c in new:  # Alg. 4 over the class's samples in this experience's training data
                rows = torch.nonzero(labels == c).flatten()
                exemplars[c] = pairs[rows[herding(features[rows], m)]]
            else:         # Alg. 5: the first m of the herded list (unchanged between experiences)
                exemplars[c] = self.exemplars[c][:m] if exp is not None else self.exemplars[c]
        kept = [c for c in classes if len(exemplars[c])]
        means = [F.normalize(features[[row[tuple(p)] for p in exemplars[c].tolist()]].mean(0), dim=0) for c in kept]
        return Classifier(exemplars, torch.tensor(kept, dtype=torch.long),
                          torch.stack(means) if means else torch.zeros(0, features.shape[1]))

    def _stored_pairs(self) -> torch.Tensor:
        parts = [self.exemplars[c] for c in sorted(self.exemplars)]
        return torch.cat(parts).long() if parts else torch.zeros((0, 2), dtype=torch.long)

    # -- resume ---------------------------------------------------------------------------
    def state_dict(self):
        return {"exemplars": {int(c): p.clone() for c, p in self.exemplars.items()},
                "seen_classes": list(self.seen_classes)}

    def load_state_dict(self, state):
        self.exemplars = {int(c): p.long() for c, p in state["exemplars"].items()}
        self.seen_classes = [int(c) for c in state["seen_classes"]]
        self._current, self.teacher, self._classifier, self._stale = None, None, None, True
