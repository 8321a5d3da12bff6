"""Plugins by name: finding them (:mod:`~clbench.plugins.registry`), building them from a config
(:mod:`~clbench.plugins.build`) and describing them without importing them
(:mod:`~clbench.plugins.describe`)."""
