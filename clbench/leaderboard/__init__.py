"""Leaderboards: a suite is a grid of runs, a leaderboard directory is its versioned result.

One concept per module:

* :mod:`~clbench.leaderboard.suite`: read and check a suite YAML, expand its grid into
  resolved run configs (one per benchmark x model x strategy x order x seed);
  :mod:`~clbench.leaderboard.suite_file`: the file's fields and their rules.
* :mod:`~clbench.leaderboard.entries`: write, read and verify one JSON file per run, named by
  the hash of its resolved config; :mod:`~clbench.leaderboard.schema`: its fields and their
  types, the typed entry tables and ``compare`` read.
* :mod:`~clbench.leaderboard.rescore`: recompute an entry's scores from its stored matrices
  and refuse an entry whose scores differ.
* :mod:`~clbench.leaderboard.manifest`: ``DIR/suite.json``, the suite's grid in order.
* :mod:`~clbench.leaderboard.execute`: run what is missing, resume what was interrupted,
  record failures, skip what is done.
* :mod:`~clbench.leaderboard.lock`: one lock per grid point, so several processes can share
  a directory.
* :mod:`~clbench.leaderboard.launch`, :mod:`~clbench.leaderboard.worker`,
  :mod:`~clbench.leaderboard.slurm`: the grid over local worker processes or SLURM jobs.
* :mod:`~clbench.leaderboard.table`: aggregate entries into per-benchmark tables
  (mean and 95% interval over task orders, rank);
  :mod:`~clbench.leaderboard.stats`: the replication unit, intervals and rank groups;
  :mod:`~clbench.leaderboard.power`: one pair's noise, the gap it detects and its power;
  :mod:`~clbench.leaderboard.cell_text`: how a table's cells are written, in every view.
* :mod:`~clbench.leaderboard.compare`: the same strategies across task orders (worst order,
  range, Kendall's tau between per-order rankings, a paired test).
* :mod:`~clbench.leaderboard.render`: ``README.md`` and a self-contained ``index.html``;
  :mod:`~clbench.leaderboard.markdown`: text from files written into Markdown literally.
* :mod:`~clbench.leaderboard.doc_tables`: the leaderboard tables quoted in ``docs/*.md``,
  written from the committed entries (``--check`` says where a document differs);
  :mod:`~clbench.leaderboard.learned`: which tasks each method learned (R's diagonal against
  the untrained score and a floor), read before any forgetting is.
* :mod:`~clbench.leaderboard.verify`: rerun entries from their recorded configs and compare
  their numbers with the committed ones.
* :mod:`~clbench.leaderboard.trust`: what a received folder's entries may make verify run
  (registered components of installed packages, within their suite's values), checked before
  anything is imported.

Nothing here imports torch at module level, so the CLI's parser stays fast.
"""
