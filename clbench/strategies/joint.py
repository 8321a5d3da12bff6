"""Joint training: one model trained once on the union of every experience's training data.

The usual upper bound (it sees all data i.i.d., which no continual learner may). It trains a
single stage for ``train.epochs`` epochs over the union, so it takes as many gradient steps as
a sequential method takes over the whole stream. Its R matrix therefore has one row (after
the joint stage); scores that need intermediate stages (BWT, FWT, forgetting) are undefined
and recorded as null.
"""

from clbench import Strategy
from clbench.data.datasets import concat


class Joint(Strategy):
    """Offline upper bound (no hyper-parameters)."""

    supports_sharded = True  # touches data only, never parameters

    single_stage = True

    def train_dataset(self, experience):
        return concat([exp.train for exp in self.experiences])
