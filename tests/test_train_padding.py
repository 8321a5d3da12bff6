"""perf/train_padding.py: it counts the positions the run's collator pads to; sorting pads least."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "examples" / "trace-mini-seq_ft.yaml"


def test_counts_the_collators_positions_and_sorting_never_pads_more():
    out = subprocess.run([sys.executable, str(ROOT / "perf" / "train_padding.py"), "--config", str(CONFIG)],
                         capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    rows = {r[0].strip(): [float(c.strip().replace(",", "").rstrip("x")) for c in r[1:]]
            for r in (line.strip("|").split("|") for line in out.splitlines() if line.startswith("| "))
            if "---" not in r[0] and r[0].strip() != "experience"}
    assert len(rows) == 8  # trace-mini's eight tasks

    from clbench.config.load import load_config
    from clbench.data.datasets import make_loader
    from clbench.engine.parts import build_parts

    parts = build_parts(load_config(CONFIG))
    collate = parts.objective.collate(train=True)
    for exp in parts.experiences:
        n, tokens, shuffled, real, grouped, _, saves, ordered, _, ceiling = rows[exp.name]
        batches = list(make_loader(exp.train, parts.config.train.batch_size, shuffle=True, seed=0, collate_fn=collate))
        assert shuffled == sum(b["attention_mask"].numel() for b in batches)
        assert tokens == sum(int(b["attention_mask"].sum()) for b in batches) and n == len(exp.train)
        assert tokens <= ordered <= min(grouped, shuffled) and ceiling == round(shuffled / ordered, 3)
        lengths = parts.objective.lengths(exp.train)
        assert sum(lengths) == tokens and saves == round(shuffled / grouped, 3)
