"""The model-size check before a build: free of side effects on the run (random generators,
time), never building a factory that reads weights, and counting a CUDA device's memory where
the run trains on one. The command-line cases are in tests/cli/test_bad_inputs.py."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch

from clbench.errors import UserError
from clbench.models import footprint
from clbench.models.factories import mlp, vit

DIGITS = {"num_classes": 10, "input_shape": (1, 8, 8)}
WHERE = "config.yaml: model.init_args"


def test_an_ordinary_model_passes_in_milliseconds_and_leaves_the_generators_as_they_were():
    before = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    footprint.check_fits(mlp, {"hidden": 400}, DIGITS, {"accelerator": "cpu"}, where=WHERE)  # imports, once
    start = time.perf_counter()
    footprint.check_fits(mlp, {"hidden": 400}, DIGITS, {"accelerator": "cpu"}, where=WHERE)
    assert time.perf_counter() - start < 0.1
    assert torch.equal(before[0], torch.get_rng_state()) and before[1] == random.getstate()
    assert (before[2] == np.random.get_state()[1]).all()


def test_factories_that_read_weights_and_plugins_are_not_built_twice():
    footprint.check_fits(vit, {"pretrained": True, "embed_dim": 10**30}, DIGITS, {}, where=WHERE)
    footprint.check_fits(vit, {"checkpoint_path": "w.pth", "embed_dim": 10**30}, DIGITS, {}, where=WHERE)

    def plugin(**kwargs):
        raise AssertionError("a plugin's factory was called by the check")

    footprint.check_fits(plugin, {"hidden": 10**30}, DIGITS, {}, where=WHERE)


def test_a_run_on_a_cuda_device_is_checked_against_its_free_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (10**9, 80 * 10**9))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    args = {"hidden": 20000}  # 400 million parameters: 1.6 GB, and as much again for their gradients
    with pytest.raises(UserError) as raised:
        footprint.check_fits(mlp, args, DIGITS, {"accelerator": "gpu", "devices": [1]}, where=WHERE)
    assert str(raised.value) == (f"{WHERE}: the model needs 3.2 GB (401,520,010 parameters and their gradients), "
                                 "but cuda:1 has 1.0 GB free (lower hidden=20000)")
    footprint.check_fits(mlp, args, DIGITS, {"accelerator": "cpu"}, where=WHERE)
    footprint.check_fits(mlp, args, DIGITS, {"accelerator": "gpu", "strategy": "fsdp"}, where=WHERE)
    monkeypatch.setenv("LOCAL_RANK", "1")  # the second process of a ddp run: its own device
    assert footprint.cuda_device({"devices": 2}) == 1 and footprint.cuda_device({"devices": "0,3"}) == 3
