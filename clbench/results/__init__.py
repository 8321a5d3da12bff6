"""What a run reports: ``result.json`` (:mod:`~clbench.results.assemble`), what the record says
about the run itself, which code made it, its terminal rendering and its figures."""
