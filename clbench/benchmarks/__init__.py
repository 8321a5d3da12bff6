"""Stream builders, one module per stream. Each builder returns an Avalanche scenario that
carries clbench metadata (see :mod:`clbench.data.streams`)."""
