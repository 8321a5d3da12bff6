"""Run configs: YAML in, a checked plain dict out (:mod:`clbench.config.load`), the one
mechanism that checks a value against a type annotation (:mod:`clbench.config.validation`),
and a component's ``init_args`` checked against its signature (:mod:`clbench.config.init_args`).

Why not jsonargparse or LightningCLI, which read the same ``class_path``/``init_args`` shape:
both resolve a ``class_path`` by importing it before they check anything else, so a mistyped
epoch count in a suite of 200 runs would first import torch and every plugin (seconds), and a
config someone sent (a leaderboard entry, a saved model's ``model.json``) would run the code it
names before it could be refused (:mod:`clbench.plugins.trusted`). Here the file is checked with
pydantic first (no torch; ``tests/config/test_config_schema.py`` fails if it starts to load it),
names are looked up in entry-point metadata, and only then is anything imported; every error is
one line naming the file and field, as the CLI's contract asks.
"""
