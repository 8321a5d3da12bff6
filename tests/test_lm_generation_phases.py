"""perf/lm_generation.py --phases: the greedy loop's forwards sorted into prefill and decoding
steps, counted as the loop computes them, and the model left as it was."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from helpers import tiny_lm

ROOT = Path(__file__).resolve().parents[1]


def test_phases_counts_the_prefilled_positions_and_the_steps_by_live_rows(capsys):
    from clbench.objectives.greedy_loop import greedy

    spec = importlib.util.spec_from_file_location("lm_generation", ROOT / "perf" / "lm_generation.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    model = tiny_lm()
    rows = [torch.tensor([5, 6, 7, 8]), torch.tensor([9, 10, 11, 12, 13, 14])]  # no shared prefix: one part

    def pooled():
        return greedy(model, rows, caps=[3, 5], keys=[0, 0], pad_id=0, eos_id=None)

    script.phases(model, pooled)
    out = capsys.readouterr().out
    # one forward over both rows padded to 6 positions; then 4 steps: 2 with both rows, 2 with the cap-5 row
    assert "prefill" in out and "in 1 forwards, 12 positions" in out and "4 decoding steps" in out
    assert "| 1 | 2 |" in out and "| 2-8 | 2 |" in out
    assert "forward" not in vars(model.hf)  # the timing wrapper is gone
