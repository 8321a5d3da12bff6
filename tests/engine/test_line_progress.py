"""Without a terminal a run prints progress lines (stage, every 10%, and at least every
CLBENCH_PROGRESS_EVERY_S seconds, here 0.5 s) with elapsed and estimated time."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import REPO, tiny_config

SLOW = '''
import time
from clbench.strategies.naive import Naive


class SlowFirstStep(Naive):
    """One batch that takes 2.5 s: a long stage with nothing to report between batches."""

    def training_loss(self, ctx, inputs, targets, outputs, loss):
        if not getattr(self, "slept", False):
            self.slept = True
            time.sleep(2.5)
        return loss
'''


def test_a_run_writing_to_a_file_prints_progress_lines_during_a_long_batch(tmp_path, write_yaml):
    plugin = tmp_path / "slow.py"
    plugin.write_text(SLOW)
    cfg = tiny_config(benchmark={"class_path": "digits-domains", "init_args": {"domains": ["rot0", "rot90"]}},
                      strategy={"class_path": f"{plugin}:SlowFirstStep"}, logging={"progress": True})
    log = tmp_path / "run.log"
    with open(log, "w") as handle:  # stdout and stderr to a file, as `clbench run ... > run.log 2>&1`
        proc = subprocess.run([sys.executable, "-m", "clbench.cli.main", "run", "-c", str(write_yaml(cfg)),
                               "-o", str(tmp_path / "out")], cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
                              env={**os.environ, "CLBENCH_PROGRESS_EVERY_S": "0.5"}, timeout=300)
    text = log.read_text()
    assert proc.returncode == 0, text
    lines = text.splitlines()
    assert "exp 1/2 rot0: training, 1 epoch(s)" in lines
    waiting = [line for line in lines if line.startswith("exp 1/2 rot0 · epoch 1/1 · train 0/")]
    assert len(waiting) >= 2, text  # the heartbeat, while the first batch sleeps
    assert all("elapsed 0:00:0" in line and "eta —" in line for line in waiting)
    assert any(" (100%) " in line and "eta 0:00:00" in line for line in lines if "· train " in line)
    assert any(line.startswith("untrained · evaluating") for line in lines)
    assert any(line.startswith("exp 2/2 rot90 · evaluated") for line in lines)
