"""A strategy in its own file, outside the package: run it by import path.

    clbench run --config configs/examples/digits-domains-replay.yaml --output runs/mine \
        strategy.class_path=examples/my_strategy.py:L2Anchor strategy.init_args={strength: 1.0}
"""

from typing import Annotated

import torch
from pydantic import Field

from clbench import Strategy


class L2Anchor(Strategy):
    """Pull the weights towards where they were at the end of the previous experience.

    The simplest regulariser against forgetting (an isotropic EWC): ``strength/2 * ||w - w*||^2``.
    """

    def __init__(self, strength: Annotated[float, Field(ge=0)] = 1.0):  # checked from the config, range included
        super().__init__()
        self.strength = strength
        self.anchor: list[torch.Tensor] = []

    def after_experience(self, ctx, experience):
        self.anchor = [p.detach().clone() for p in ctx.model.parameters()]

    def training_loss(self, ctx, x, y, logits, loss):
        if not self.anchor:
            return loss
        penalty = sum(((p - a) ** 2).sum() for p, a in zip(ctx.model.parameters(), self.anchor))
        return loss + 0.5 * self.strength * penalty

    def state_dict(self):
        return {"anchor": self.anchor}

    def load_state_dict(self, state):
        self.anchor = list(state["anchor"])
