"""Objectives: what a run learns from a batch and how it scores a test experience.

The stream names its objective (``StreamSpec.objective``); a config's ``objective:`` section
overrides it. The module, the runner and the strategies ask the objective for the loss, the
evaluation step, the per-column metrics and the batch collation, so none of them branches on
the kind of data. Built-ins: ``classification`` (cross-entropy, accuracy), ``regression``
(squared error, lower is better). See ``docs/engine.md``.
"""

from clbench.objectives.base import Objective

__all__ = ["Objective"]
