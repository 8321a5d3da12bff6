"""Cumulative training: at experience i, train on the union of experiences 0..i.

Keeps all past data (an unbounded replay buffer), so it bounds what rehearsal can reach at
each stage while still training stage by stage; the model is fine-tuned, not re-initialised.
"""

from clbench import Strategy
from clbench.data.datasets import concat


class Cumulative(Strategy):
    """Train on everything seen so far (no hyper-parameters)."""

    supports_sharded = True  # touches data only, never parameters

    def train_dataset(self, experience):
        return concat([exp.train for exp in self.experiences[: experience.position + 1]])
