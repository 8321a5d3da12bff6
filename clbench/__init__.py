"""clbench: a continual-learning benchmark harness on PyTorch Lightning.

Importing this package is cheap on purpose (no torch): the CLI's fast commands rely on it.
Heavy modules are imported where they are used.
"""

__version__ = "0.1.0"
