"""The thesis's variant 2 ("Prototype router"): one routing decision, fully split final blocks.

Structure. A timm ViT is cut at block ``split``: the early part (patch embedding, class
token, position embedding, blocks ``0..split-1``) is the shared *trunk*, frozen by default;
the final blocks, the final norm and the head are duplicated into ``num_experts`` *paths*
("duplicated per expert path, with per-path heads"). Each image is routed once, by the
statistics of its patch tokens at the trunk's output (the latent space entering block
``split``: "block 8 in depth" of 12, 0-based), and runs its whole remaining depth and its
head in that one path. Paths are copies of the dense ViT's final part (random or transferred
weights): with one path the model computes exactly the dense ViT. This differs enough from
an MoE MLP inside a block to be its own module; ``vit_moe(..., router="prototype")`` (label
``Prototype router``) builds it, so the suite and the labels stay in one factory.

Choices where the thesis is open (its §3.2 describes variant 2 in one paragraph):

* Statistics. "The mean of the patches of all of the images routed to a given expert each
  batch, and the other as the standard deviation of the same": patch tokens only (the class
  and other prefix tokens are not patches); mean and population standard deviation per
  channel over *all* patches of the images concerned. An image's own statistics (what is
  routed) are the same over its own patches.
* Score (how mean and std combine is not stated; "the balance between mean and standard
  deviation" is named as a parameter). ``metric="cosine"`` (default, the thesis's geometric
  router): ``(1 - w) cos(mu, m_e) + w cos(sigma, s_e)``; cosine also ignores the scale gap
  between one image's std and a prototype's pooled std (which adds the spread between
  images). ``metric="w2"``: minus ``(1 - w)|mu - m_e|^2 + w|sigma - s_e|^2``, the squared
  2-Wasserstein distance of diagonal Gaussians when ``w = 0.5`` up to a factor. ``w`` =
  ``std_weight`` (0.5: no value is given). Top-1 by score; recorded probabilities are
  ``softmax(score / temperature)``.
* Update: EMA as in the thesis's equation, ``theta <- alpha theta + (1 - alpha) theta_batch``
  for the mean and the std prototypes of each expert that received images, in training
  forwards only. ``alpha = 0.3`` reads the one number the thesis gives for this model,
  ``routing_alpha=0.3``, as the EMA's alpha (the thesis's symbol for it); it could also be
  the mean/std balance.
* Initialisation ("each expert is initialized as the average of the patches for a single
  domain using one image per class"): at the start of each experience of a domain not seen
  before, the next uninitialised expert takes the statistics of one image per class of that
  experience's training set (the first of each class in dataset order). Domains arrive one
  at a time, so no future domain's data is used (an up-front initialisation from every
  domain would need it); with more domains than experts the later domains get no expert of
  their own and go to the nearest. This uses the domain boundary and class labels at
  initialisation only (the thesis's own caveat). The runner calls :meth:`begin_experience`;
  a bare training loop that never does gets expert 0 initialised from its first training
  batch, label-free. Uninitialised experts take no images; before any is initialised every
  image goes to expert 0.
* Frozen trunk: its parameters never require gradients and it runs in evaluation mode, so
  the routing features do not drift ("to ensure strong routing stability"); ``freeze_trunk
  =False`` trains it. No auxiliary loss: routing is by buffers, not learned.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from clbench.models import routing_channel as routing
from clbench.config.validation import ArgumentError

METRICS = ("cosine", "w2")


def patch_stats(tokens: Tensor, prefix: int) -> tuple[Tensor, Tensor]:
    """Per image: mean and population std per channel over its patch tokens, ``(B, D)`` each."""
    patches = tokens[:, prefix:].float()
    return patches.mean(1), patches.std(1, unbiased=False)


def pooled_stats(tokens: Tensor, prefix: int) -> tuple[Tensor, Tensor]:
    """Mean and population std per channel over all patches of all images, ``(D,)`` each."""
    patches = tokens[:, prefix:].float().reshape(-1, tokens.shape[-1])
    return patches.mean(0), patches.std(0, unbiased=False)


class PrototypeRouter(nn.Module):
    """Mean and std prototypes per expert; routes images to the best-scoring initialised one."""

    records_routing = True

    def __init__(self, dim: int, num_experts: int, prefix: int = 1, alpha: float = 0.3,
                 std_weight: float = 0.5, metric: str = "cosine", temperature: float = 0.1):
        super().__init__()
        if num_experts < 1:
            raise ValueError(f"num_experts must be >= 1, got {num_experts}")
        for name, value in (("alpha", alpha), ("std_weight", std_weight)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {value}")
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.dim, self.num_experts, self.prefix = dim, num_experts, prefix
        self.alpha, self.std_weight, self.metric, self.temperature = alpha, std_weight, metric, temperature
        self.register_buffer("mean", torch.zeros(num_experts, dim))
        self.register_buffer("std", torch.zeros(num_experts, dim))
        self.register_buffer("ready", torch.zeros(num_experts, dtype=torch.bool))
        # the domain id each expert was initialised from (-1: none; -2: a batch, no domain known)
        self.register_buffer("owner", torch.full((num_experts,), -1, dtype=torch.long))

    def initialize(self, expert: int, tokens: Tensor, owner: int = -2) -> None:
        """Expert ``expert``'s prototypes := the pooled patch statistics of ``tokens``."""
        mean, std = pooled_stats(tokens.detach(), self.prefix)
        self.mean[expert].copy_(mean)
        self.std[expert].copy_(std)
        self.ready[expert] = True
        self.owner[expert] = owner

    def scores(self, mu: Tensor, sigma: Tensor) -> Tensor:
        """``(B, E)`` routing scores of images with statistics ``mu``, ``sigma`` (higher: nearer)."""
        w = self.std_weight
        if self.metric == "cosine":
            score = ((1 - w) * F.normalize(mu, dim=-1) @ F.normalize(self.mean, dim=-1).T
                     + w * F.normalize(sigma, dim=-1) @ F.normalize(self.std, dim=-1).T)
        else:
            score = -((1 - w) * torch.cdist(mu, self.mean).square() + w * torch.cdist(sigma, self.std).square())
        if not bool(self.ready.any()):
            return torch.zeros_like(score)  # nothing initialised: every image to expert 0
        return score.masked_fill(~self.ready, float("-inf"))

    def forward(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Route ``tokens (B, T, D)`` per image: ``(experts (B,), probs (B, E))``; in training
        the chosen experts' prototypes then move toward this batch (EMA)."""
        tokens = tokens.detach()
        if self.training and not bool(self.ready.any()):
            self.initialize(0, tokens)
        mu, sigma = patch_stats(tokens, self.prefix)
        score = self.scores(mu, sigma)
        experts = score.argmax(-1)
        probs = (score / self.temperature).softmax(-1)
        if self.training:
            self._update(tokens, experts)
        return experts, probs

    def _update(self, tokens: Tensor, assigned: Tensor) -> None:
        """EMA step of each hit expert's prototypes toward the pooled statistics of its images."""
        patches = tokens[:, self.prefix:].float()  # (B, P, D)
        num, per_image = self.num_experts, patches.shape[1]
        counts = torch.bincount(assigned, minlength=num) * per_image
        hit = (counts > 0)[:, None]
        denom = counts.clamp(min=1)[:, None]
        sums = patches.new_zeros(num, self.dim).index_add(0, assigned, patches.sum(1))
        means = sums / denom
        deviations = (patches - means[assigned][:, None]).square().sum(1)
        stds = (patches.new_zeros(num, self.dim).index_add(0, assigned, deviations) / denom).sqrt()
        a = self.alpha
        self.mean.copy_(torch.where(hit, a * self.mean + (1 - a) * means, self.mean))
        self.std.copy_(torch.where(hit, a * self.std + (1 - a) * stds, self.std))

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_experts={self.num_experts}, metric={self.metric}, alpha={self.alpha}, "
                f"std_weight={self.std_weight}")


class ExpertPath(nn.Module):
    """One expert's copy of the final blocks, the final norm and the head (timm's pooling)."""

    def __init__(self, vit: nn.Module, split: int):
        super().__init__()
        self.blocks = nn.Sequential(*[copy.deepcopy(b) for b in list(vit.blocks)[split:]])
        self.norm = copy.deepcopy(vit.norm)
        self.attn_pool = copy.deepcopy(vit.attn_pool)
        self.fc_norm = copy.deepcopy(vit.fc_norm)
        self.head_drop = copy.deepcopy(vit.head_drop)
        self.head = copy.deepcopy(vit.head)
        self.pool_type, self.prefix = vit.global_pool, vit.num_prefix_tokens
        self.include_prefix = getattr(vit, "pool_include_prefix", False)

    def forward(self, tokens: Tensor) -> Tensor:
        from timm.layers import global_pool_nlc

        x = self.norm(self.blocks(tokens))
        if self.attn_pool is not None:
            x = self.attn_pool(x if self.include_prefix else x[:, self.prefix:])
        else:
            x = global_pool_nlc(x, pool_type=self.pool_type, num_prefix_tokens=self.prefix,
                                reduce_include_prefix=self.include_prefix)
        return self.head(self.head_drop(self.fc_norm(x)))


class PrototypeViT(nn.Module):
    """A frozen ViT trunk, a prototype router, and one full final part per expert."""

    def __init__(self, vit: nn.Module, split: int, num_experts: int = 4, freeze_trunk: bool = True,
                 **router_args):
        super().__init__()
        depth = len(vit.blocks)
        if not 0 <= split <= depth:
            raise ValueError(f"split must lie in 0..{depth}, got {split}")
        self.paths = nn.ModuleList([ExpertPath(vit, split) for _ in range(num_experts)])
        vit.blocks = nn.Sequential(*list(vit.blocks)[:split])
        vit.norm, vit.fc_norm, vit.head_drop, vit.head = nn.Identity(), nn.Identity(), nn.Identity(), nn.Identity()
        vit.attn_pool = None
        self.trunk = vit
        self.split, self.num_experts, self.freeze_trunk = split, num_experts, freeze_trunk
        self.num_classes = getattr(vit, "num_classes", None)
        self.moe_blocks = list(range(split, depth))
        self.router = PrototypeRouter(vit.embed_dim, num_experts, prefix=vit.num_prefix_tokens, **router_args)
        if freeze_trunk:
            self.trunk.requires_grad_(False)

    def features(self, x: Tensor) -> Tensor:
        """Tokens at the routing point, ``(B, T, D)``: the trunk's output. A frozen trunk runs
        in evaluation mode (no dropout or drop-path: stable routing features) and keeps its
        mode flag otherwise, so Lightning sees no module left in evaluation mode."""
        if not (self.freeze_trunk and self.trunk.training):
            return self.trunk.forward_features(x)
        self.trunk.eval()
        try:
            with torch.no_grad():
                return self.trunk.forward_features(x)
        finally:
            self.trunk.train()

    def forward(self, x: Tensor) -> Tensor:
        tokens = self.features(x)
        experts, probs = self.router(tokens)
        routing.record(self.router, experts=experts[:, None], gates=probs)
        order = torch.argsort(experts, stable=True)
        sizes = torch.bincount(experts, minlength=self.num_experts).tolist()
        chunks = tokens.index_select(0, order).split(sizes)
        ys = [self.paths[e](chunk) for e, chunk in enumerate(chunks) if sizes[e]]
        y = torch.cat(ys) if len(ys) > 1 else ys[0]
        return torch.empty_like(y).index_copy_(0, order, y)

    @torch.no_grad()
    def begin_experience(self, experience) -> None:
        """Initialise the next free expert from one image per class of a new domain's training set."""
        domain = int(getattr(experience, "domain_id", -2))
        if domain >= 0 and bool((self.router.owner == domain).any()):
            return  # this domain already has its expert
        free = (~self.router.ready).nonzero().flatten()
        if not len(free):
            return  # every expert taken: the domain goes to the nearest prototypes
        images = one_image_per_class(experience.train)
        param = next(self.trunk.parameters())
        was_training = self.trunk.training
        self.trunk.eval()
        try:
            tokens = self.features(images.to(device=param.device, dtype=param.dtype))
        finally:
            self.trunk.train(was_training)
        self.router.initialize(int(free[0]), tokens, owner=domain)


def one_image_per_class(dataset) -> Tensor:
    """The first image of every class in ``dataset`` (in dataset order), stacked ``(C, ...)``."""
    from clbench.data.datasets import targets_of

    targets = targets_of(dataset)
    if not len(targets):
        raise ValueError("cannot initialise a prototype from an empty training set")
    classes = torch.unique(targets)
    first = [int((targets == c).nonzero()[0]) for c in classes]
    return torch.stack([torch.as_tensor(dataset[i][0]) for i in first])


def build(vit: nn.Module, blocks: list[int], num_experts: int, top_k: int, num_shared: int, level: str,
          router_args: dict | None, unsupported: dict) -> PrototypeViT:
    """``vit_moe``'s prototype variant: checks the arguments that do not apply, then wraps ``vit``."""
    depth = len(vit.blocks)
    if blocks and blocks != list(range(blocks[0], depth)):
        raise ArgumentError("model", "moe_blocks", f"router 'prototype' splits the final blocks: moe_blocks must be a "
                            f"suffix range(k, {depth}), got {blocks}", fix=f"e.g. moe_blocks: [{depth - 1}]")
    for field, value, wanted in (("top_k", top_k, 1), ("num_shared", num_shared, 0), ("level", level, "image")):
        if value != wanted:
            raise ArgumentError("model", field, f"router 'prototype' routes each image once to one path, so "
                                f"{field} = {value!r} does not apply", fix=f"set {field}: {wanted}")
    given = [name for name, value in unsupported.items() if value is not None]
    if given:
        raise ArgumentError("model", given[0], f"router 'prototype' does not take {', '.join(given)}",
                            fix=f"remove {', '.join(given)}")
    split = blocks[0] if blocks else depth
    return PrototypeViT(vit, split, num_experts, **(router_args or {}))
