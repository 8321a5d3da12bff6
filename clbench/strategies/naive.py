"""Naive fine-tuning: train on each experience in turn with nothing against forgetting.

The lower bound of every leaderboard. All behaviour is the :class:`~clbench.strategy.Strategy`
defaults; this class only gives it a name.
"""

from clbench import Strategy


class Naive(Strategy):
    """Sequential fine-tuning (no hyper-parameters)."""

    supports_sharded = True  # touches data only, never parameters
