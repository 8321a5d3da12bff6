"""Plugins built from a config (:mod:`~clbench.plugins.build`) and described without being
imported (:mod:`~clbench.plugins.describe`); finding them by name is :mod:`clbench.registry`,
on the ground floor because the config, the streams and the results all look names up."""
