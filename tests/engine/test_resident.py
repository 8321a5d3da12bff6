"""Where the module lives between a run's Lightning calls, and which optimizer step it gets.

Lightning's ``Strategy.teardown`` moves the module to host memory after every ``fit`` and
``validate``; a run keeps it on its device instead (``ContinualModule.resident``). On this CPU
nothing would move either way, so the tests count the moves Lightning asks for and the ones
that reach ``nn.Module``.
"""

from __future__ import annotations

from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from clbench.config.load import resolve_config
from clbench.engine.module import ContinualModule
from clbench.engine.runner import run
from clbench.plugins.build import fuses_on_cuda, optimizer_factory
from clbench.strategy import Strategy
from helpers import tiny_config


@pytest.fixture
def moves(monkeypatch):
    """How often ``ContinualModule.cpu`` was asked for (by Lightning's teardown and the module),
    and how often it moved the module (reached ``LightningModule.cpu``)."""
    counts = {"asked": 0, "moved": 0}
    asked, moved = ContinualModule.cpu, pl.LightningModule.cpu

    def ask(self):
        counts["asked"] += 1
        return asked(self)

    def move(self):
        counts["moved"] += 1
        return moved(self)

    monkeypatch.setattr(ContinualModule, "cpu", ask)
    monkeypatch.setattr(pl.LightningModule, "cpu", move)
    return counts


def _module_and_trainer():
    torch.manual_seed(0)
    module = ContinualModule(nn.Linear(4, 3), Strategy(), optimizer=lambda p: torch.optim.AdamW(p, lr=0.01))
    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,)))
    loader = DataLoader(data, batch_size=8)
    trainer = pl.Trainer(max_epochs=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu")
    return module, trainer, loader


def _stage(trainer, module, loader):
    trainer.fit_loop.max_epochs = trainer.current_epoch + 1
    trainer.fit(module, loader)
    trainer.validate(module, [loader], verbose=False)


def test_lightning_moves_the_module_after_every_call_outside_a_run(moves):
    module, trainer, loader = _module_and_trainer()
    for _ in range(2):
        _stage(trainer, module, loader)
    assert moves["asked"] == moves["moved"] == 4  # a fit and a validate per stage


def test_a_resident_module_stays_where_it_is_until_the_run_ends(moves):
    module, trainer, loader = _module_and_trainer()
    with module.resident():
        for _ in range(2):
            _stage(trainer, module, loader)
        assert moves["asked"] == 4 and moves["moved"] == 0
    assert moves["moved"] == 1  # once, when the run lets go of it
    assert next(module.parameters()).device.type == "cpu"


def test_the_stage_optimizer_state_is_dropped_before_the_teardown(monkeypatch):
    module, trainer, loader = _module_and_trainer()
    seen = []
    teardown = type(trainer.strategy).teardown

    def spy(strategy):
        seen.append(sum(len(optimizer.state) for optimizer in strategy.optimizers))
        return teardown(strategy)

    monkeypatch.setattr(type(trainer.strategy), "teardown", spy)
    trainer.fit_loop.max_epochs = 1
    trainer.fit(module, loader)
    assert seen == [0]  # AdamW held state for both parameters after its steps; none is copied to the host


def test_a_run_moves_its_module_once(moves):
    run(resolve_config(tiny_config()), None)  # 3 experiences
    assert moves["asked"] == 4 + 3 + 1  # after 4 evaluation passes and 3 fits, and at the run's end
    assert moves["moved"] == 1


def _fake(cuda: bool, floating: bool = True):
    return SimpleNamespace(is_cuda=cuda, is_floating_point=lambda: floating)


def test_the_fused_step_is_chosen_on_cuda_parameters_only():
    adamw = torch.optim.AdamW
    assert fuses_on_cuda(adamw, {"lr": 1e-3}, [_fake(True), _fake(True)])
    assert fuses_on_cuda(adamw, {}, [{"params": [_fake(True)]}, {"params": _fake(True), "lr": 0.1}])
    assert not fuses_on_cuda(adamw, {}, [_fake(True), _fake(False)])  # one CPU tensor: no fused kernel for the mix
    assert not fuses_on_cuda(adamw, {}, [_fake(True, floating=False)])
    assert not fuses_on_cuda(adamw, {}, [])
    for chosen in ({"fused": False}, {"foreach": True}, {"differentiable": True}):
        assert not fuses_on_cuda(adamw, chosen, [_fake(True)])  # the config decides
    assert not fuses_on_cuda(torch.optim.RMSprop, {}, [_fake(True)])  # no fused kernel in its signature
    assert not fuses_on_cuda(adamw, {}, [nn.Parameter(torch.zeros(2))])


def test_a_cpu_optimizer_is_built_as_torch_builds_it():
    cfg = resolve_config(tiny_config(train={"optimizer": {"class_path": "adamw", "init_args": {"lr": 0.01}}}))
    params = [nn.Parameter(torch.zeros(3))]
    built = optimizer_factory(cfg, "test.yaml")(iter(params))  # a generator of parameters works too
    assert isinstance(built, torch.optim.AdamW)
    assert built.defaults == torch.optim.AdamW(params, lr=0.01).defaults
    assert built.defaults["fused"] is None
