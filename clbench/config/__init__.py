"""Run configs: YAML in, a checked plain dict out (:mod:`clbench.config.load`), and the one
mechanism that checks a value against a type annotation (:mod:`clbench.config.validation`)."""
