"""Models: the basic factories (:mod:`~clbench.models.factories`), vision and language models,
and the layers strategies insert into a model (:mod:`clbench.models.layers`)."""
