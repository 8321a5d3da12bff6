"""Built-in strategy plugins, one module per method. Each is a :class:`clbench.strategy.Strategy`."""
