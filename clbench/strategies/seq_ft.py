"""Sequential full fine-tuning (SeqFT): every weight trained on each task in turn.

The language-model papers' name for :mod:`clbench.strategies.naive`: nothing against forgetting, all
parameters trainable. It is a separate entry so a TRACE leaderboard can list it under the name
the papers use; its behaviour and results are those of ``naive``.
"""

from clbench.strategies.naive import Naive


class SeqFT(Naive):
    """Sequential full fine-tuning (no hyper-parameters; identical to ``naive``)."""
