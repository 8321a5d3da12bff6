"""What the harness passes to a plugin's constructor itself, so that a config may not set it.

A model's builder gets some arguments from the run's objective (``Objective.model_args``, their
values from ``Objective.model_kwargs(stream)``): the run preflight, the suite preflight and
``clbench list`` all read which ones from here, so they cannot disagree.
"""

from __future__ import annotations

#: The model arguments any built-in objective supplies: classification's ``num_classes`` and
#: ``input_shape``, regression's ``input_shape`` and ``output_dim``, a language model's none.
#: Where a run's objective is known before its stream is built (the config names it, or the
#: benchmark declares it), exactly that objective's ``model_args`` are supplied; this is what may
#: be supplied where it is not (a stream that says its objective only once built, a listing).
MODEL_ARGS: tuple[str, ...] = ("num_classes", "input_shape", "output_dim")
