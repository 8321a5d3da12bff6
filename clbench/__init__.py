"""clbench: a continual-learning benchmark harness on PyTorch Lightning.

Importing this package is cheap on purpose (no torch): the CLI's fast commands rely on it.
Heavy modules are imported where they are used.
"""

__version__ = "0.1.0"

# The public API, imported on first use (``clbench.run`` loads torch; ``import clbench`` does not).
_LAZY = {
    "run": "clbench.api", "load_config": "clbench.api", "run_leaderboard": "clbench.api",
    "load_leaderboard": "clbench.api", "compare": "clbench.api", "RunResult": "clbench.api",
    "Leaderboard": "clbench.api", "UserError": "clbench.errors",
    "Strategy": "clbench.strategy", "Objective": "clbench.objectives.base",
}
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'clbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
