"""clbench: a continual-learning benchmark harness on PyTorch Lightning.

A map, in the order a run goes through it. A YAML config is read and checked by
:mod:`clbench.config`; the names in it (``naive``, ``digits-domains``, ``mlp``) are found by
:mod:`clbench.registry` and built by :mod:`clbench.plugins`. The benchmark gives a stream from
:mod:`clbench.data` (Avalanche scenarios, datasets, a stream described without its data) and the
model comes from :mod:`clbench.models` (factories, vision and language models, and the layers
strategies insert). The continual loop is :mod:`clbench.engine`: ``engine.parts`` builds a run's
parts once, and the runner drives Lightning experience by experience through one LightningModule
that wraps the model, a strategy (the plugin API is :mod:`clbench.strategy`; the built-in methods
are :mod:`clbench.strategies`, the built-in streams :mod:`clbench.benchmarks`) and the stream's
objective (:mod:`clbench.objectives`), scored by :mod:`clbench.metrics` (torchmetrics). What a run
reports is :mod:`clbench.results`; suites of runs, their entries, tables, page and checks are
:mod:`clbench.leaderboard`; :mod:`clbench.cli` is the command and :mod:`clbench.api` the same from
Python. :mod:`clbench.errors` holds the one error type for bad input; :mod:`clbench.io` and
:mod:`clbench.lease` are atomic writes and file locks, :mod:`clbench.received` reads a file
someone else may have made (regular, bounded), :mod:`clbench.seeding` names every generator a
run draws from and :mod:`clbench.cpu_kernels` pins the CPU kernels a process computes with.
Lightning's private API is reached only through :mod:`clbench.engine.lightning_internals`.
:data:`LAYERS` puts these rooms on floors.

Importing this package is cheap on purpose (no torch): the CLI's fast commands rely on it.
Heavy modules are imported where they are used.
"""

__version__ = "0.1.0"

#: The package's floors, bottom first: a module imports from its own floor and those below it
#: (``tests/test_architecture.py`` checks every import, in functions too). The ground holds
#: what everything may use (one error type, atomic writes and locks, received files, the plugin
#: registry, the seed protocol, the CPU kernels' pinning); a stream may use models' helpers (a weights cache) and
#: metrics' names (TRACE's scorings); the plugin API (``strategy``) and the built-in streams sit
#: below the built-in strategies, which may use a stream (the theory paper's simulator); a run's
#: record (``results.record``) is read by the metrics' error bars, so it sits with them.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("clbench.errors", "clbench.io", "clbench.lease", "clbench.limits", "clbench.quiet", "clbench.received",
     "clbench.registry", "clbench.cpu_kernels", "clbench.seeding"),
    ("clbench.config",),
    ("clbench.data",),
    ("clbench.models",),
    ("clbench.metrics", "clbench.results.record"),
    ("clbench.objectives",),
    ("clbench.strategy", "clbench.benchmarks"),
    ("clbench.strategies",),
    ("clbench.plugins",),
    ("clbench.results",),
    ("clbench.engine",),
    ("clbench.leaderboard",),
    ("clbench.api", "clbench.cli"),
)
#: The imports from a lower floor to a higher one, each with its reason (at most two).
UPWARD_IMPORTS: dict[tuple[str, str], str] = {}

# The public API, imported on first use (``clbench.run`` loads torch; ``import clbench`` does not):
# name -> module, or (module, attribute) where the name differs from the module's.
_LAZY: dict[str, str | tuple[str, str]] = {
    "run": "clbench.api", "load_config": "clbench.api", "load_model": "clbench.api", "run_leaderboard": "clbench.api",
    "load_leaderboard": "clbench.api", "compare": "clbench.api", "RunResult": "clbench.api",
    "Leaderboard": "clbench.api", "UserError": "clbench.errors", "ArgumentError": "clbench.config.validation",
    # writing a plugin (docs/strategies.md, "Writing a strategy")
    "Strategy": "clbench.strategy", "StrategyContext": "clbench.strategy", "Objective": "clbench.objectives.base",
    "ContinualModel": "clbench.models.protocol", "RoutingLayer": "clbench.models.protocol",
    "Experience": "clbench.data.streams", "derive_seed": ("clbench.seeding", "derive"),
    "full_tensor": ("clbench.models.sharded", "full"),
}
__all__ = ["__version__", *_LAZY]

#: Modules a plugin may import from, with their submodules, besides the names in ``__all__``: the
#: public API. Everything else (``clbench.engine``, ``clbench.plugins``, ``clbench.config``, ...)
#: may change without notice; a test holds the built-in strategies to this list.
PUBLIC_MODULES = ("clbench.errors", "clbench.metrics", "clbench.models.layers", "clbench.models.routing_channel",
                  "clbench.objectives", "clbench.data", "clbench.strategies", "clbench.benchmarks")


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name] if isinstance(_LAZY[name], tuple) else (_LAZY[name], name)
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'clbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
