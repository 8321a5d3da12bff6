"""The grow strategy (Grow, Don't Overwrite): function-preserving MLP expansion, G-Freeze's
untouched originals, resume after a crash, and top-N layer selection."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import crash_at, tiny_config
from torch import nn

from clbench.models.layers.grow import find_mlps, grow_mlp


def _vit():
    import timm

    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, num_classes=10,
                             depth=3)  # 3 of vit_tiny's 12 blocks: the same MLPs, a faster test


def _qwen3():
    from clbench.models.lm.causal_lm import hf_causal_lm

    return hf_causal_lm(architecture="qwen3", tokenizer="trace-mini",
                        config={"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                                "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128})


def _mlp():
    from clbench.models.factories import mlp

    return mlp(10, (1, 8, 8), hidden=32, depth=2)


def _randomise_biases(model):
    """Random initialisations zero some biases; non-zero ones test that biases are grown right."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                m.bias.normal_(0, 0.5)


KINDS = {
    "vit": (_vit, 3, lambda: (torch.randn(4, 3, 32, 32),), lambda m, x: m(x)),
    "qwen3": (_qwen3, 2, lambda: (torch.randint(0, 100, (2, 12)),), lambda m, x: m(input_ids=x).logits),
    "mlp": (_mlp, 1, lambda: (torch.randn(8, 1, 8, 8),), lambda m, x: m(x)),
}


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_growing_every_mlp_preserves_the_function(kind, k):
    build, count, inputs, call = KINDS[kind]
    torch.manual_seed(0)
    model = build().eval()
    _randomise_biases(model)
    mlps = find_mlps(model)
    assert len(mlps) == count
    (x,) = inputs()
    with torch.no_grad():
        before = call(model, x)
        shapes = {n: p.shape for n, p in model.state_dict().items()}
        widths = [grow_mlp(model, m, k) for m in mlps]
        after = call(model, x)
    assert (after - before).abs().max().item() <= 1e-5
    grown = {n: p.shape for n, p in model.state_dict().items()}
    assert set(grown) == set(shapes)  # same keys, wider shapes
    for m, p in zip(mlps, widths):
        for q in m.ups:
            assert grown[f"{q}.weight"][0] == k * p
        assert grown[f"{m.down}.weight"][1] == k * p
    assert sum(grown[n].numel() for n in grown) > sum(shapes[n].numel() for n in shapes)


def test_the_plain_mlp_is_found_as_its_first_two_linears():
    model = _mlp()  # Flatten, Linear, ReLU, Linear, ReLU, Linear
    assert [(m.name, m.ups, m.down) for m in find_mlps(model)] == [("1:3", ("1",), "3")]


def _run(tmp_path, name, **init_args):
    from clbench.config.load import resolve_config
    from clbench.engine.runner import ContinualRun

    cfg = resolve_config(tiny_config(strategy={"class_path": "grow", "init_args": init_args},
                                     train={"epochs": 1, "optimizer": {"class_path": "adamw",
                                                                       "init_args": {"lr": 0.01, "weight_decay": 0.1}}}))
    run = ContinualRun(cfg, tmp_path / name)
    return run, run.execute(), cfg


@torch.no_grad()
def _accuracy(model, dataset) -> float:
    from clbench.data.datasets import make_loader

    model.eval()
    hits = total = 0
    for x, y in make_loader(dataset, 256, shuffle=False):
        hits += (model(x).argmax(-1) == y).sum().item()
        total += len(y)
    model.train()
    return hits / total


class _Recorder:
    """Keeps the model's weights right after each growth (before any training on it)."""

    def __init__(self, strategy):
        self.after_growth = []
        grow = strategy.grow

        def recording(module, experience):
            first = strategy.experiences[0].test
            self.before = {n: p.detach().clone() for n, p in module.model.named_parameters()}
            self.scores_before = _accuracy(module.model, first)
            record = grow(module, experience)
            self.after_growth.append({n: p.detach().clone() for n, p in module.model.named_parameters()})
            self.scores_after = _accuracy(module.model, first)
            return record

        strategy.grow = recording


@pytest.fixture
def recorders(monkeypatch):
    from clbench.engine import parts

    made = []
    build_parts = parts.build_parts

    def build(*args, **kwargs):
        built = build_parts(*args, **kwargs)
        made.append(_Recorder(built.strategy))
        return built

    monkeypatch.setattr(parts, "build_parts", build)
    return made


def test_g_freeze_leaves_the_original_weights_bit_for_bit(tmp_path, recorders):
    """AdamW with weight decay: masked gradients alone would let decay move the frozen slices.
    By default the model grows once (before the second of three experiences), as in the paper."""
    run, result, _ = _run(tmp_path, "freeze")
    rec = recorders[0]
    model = run.parts.model
    grown, trained = rec.after_growth[0], dict(model.named_parameters())
    p = 32
    assert trained["1.weight"].shape == (64, 64) and trained["3.weight"].shape == (32, 64)
    assert torch.equal(trained["1.weight"][:p], rec.before["1.weight"])  # original up rows
    assert torch.equal(trained["1.bias"][:p], rec.before["1.bias"])
    assert torch.equal(trained["3.weight"][:, :p], rec.before["3.weight"] / 2)  # original down block
    assert torch.equal(trained["3.bias"], rec.before["3.bias"])
    for name in ("5.weight", "5.bias"):  # everything outside the grown MLP
        assert torch.equal(trained[name], rec.before[name])
    assert not torch.equal(trained["1.weight"][p:], grown["1.weight"][p:])  # the new copies learned
    assert not torch.equal(trained["3.weight"][:, p:], grown["3.weight"][:, p:])
    # The first experience's score right after growth is that of before it: function preserved
    # in the stream. (Training the new copies on later domains does then move it: on this
    # stream G-Freeze forgets less than naive, not nothing; see docs/strategies.md.)
    assert abs(rec.scores_after - rec.scores_before) <= 0.05
    assert rec.scores_before == pytest.approx(result["r_matrix"][0][0])
    growth = result["strategy"]["diagnostics"]["growth"]
    assert len(growth) == 1 and growth[0]["experience"] == 1 and growth[0]["layers"] == ["1:3"]
    assert growth[0]["params_after"] - growth[0]["params_before"] == 64 * 32 + 32 + 32 * 32
    assert growth[0]["params_trainable"] == 32 * 64 + 32 + 32 * 32
    assert result["model"]["params_total"] == growth[0]["params_after"]


def test_g_train_trains_the_whole_up_projection_and_nothing_else(tmp_path, recorders):
    run, _, _ = _run(tmp_path, "train", variant="train", when="once")
    grown, trained = recorders[0].after_growth[0], dict(run.parts.model.named_parameters())
    assert sorted(n for n, p in trained.items() if p.requires_grad) == ["1.bias", "1.weight"]
    assert not torch.equal(trained["1.weight"][:32], grown["1.weight"][:32])  # originals train too
    for name in ("3.weight", "3.bias", "5.weight", "5.bias"):
        assert torch.equal(trained[name], grown[name])


def test_a_crashed_growing_run_resumes_to_the_same_result(tmp_path, monkeypatch):
    """Growth before experiences 2 and 3 (widths 32 -> 64 -> 128); the crash comes after the
    second experience's checkpoint, so the resume must re-grow before the weights load."""
    from clbench.engine.runner import run

    _, reference, cfg = _run(tmp_path, "reference", when="each")
    growth = reference["strategy"]["diagnostics"]["growth"]
    assert [g["widths"] for g in growth] == [[32], [64]]
    crash_at(monkeypatch, "stage:2:step:3", cfg, tmp_path / "crashed")
    resumed = run(cfg, tmp_path / "crashed", resume=True)
    assert resumed["r_matrix"] == reference["r_matrix"]
    assert resumed["model"]["params_total"] == reference["model"]["params_total"]
    assert [g["params_after"] for g in resumed["strategy"]["diagnostics"]["growth"]] == \
        [g["params_after"] for g in growth]


class _Moves(nn.Module):
    """Three MLPs in a row behind one input; only the MLPs named in ``live`` reach the loss
    through a large factor, so their weights move most under any optimizer."""

    def __init__(self, live):
        super().__init__()
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4)) for _ in range(3))
        self.gains = [100.0 if i in live else 0.01 for i in range(3)]

    def forward(self, x):
        return sum(g * mlp(x) for g, mlp in zip(self.gains, self.mlps))[:, :2]


def test_top_n_picks_the_mlps_whose_weights_moved_most():
    from clbench.data.datasets import ArrayDataset
    from clbench.engine.module import ContinualModule
    from clbench.strategies.grow import Grow

    torch.manual_seed(0)
    data = ArrayDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    experience = type("Exp", (), {"train": data, "position": 1})()
    strategy = Grow(top_n=2, probe_steps=3, probe_batch_size=16)
    model = _Moves(live={0, 2})
    module = ContinualModule(model, strategy, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), num_classes=2)
    strategy.setup(module.context, [], seed=0)
    strategy.adapt_model(module.context, 0)
    untouched = copy.deepcopy(model.state_dict())
    record = strategy.grow(module, experience)
    assert record["layers"] == ["mlps.0.0:2", "mlps.2.0:2"]
    assert record["scores"]["mlps.1.0:2"] < min(record["scores"]["mlps.0.0:2"], record["scores"]["mlps.2.0:2"])
    assert record["probe_seconds"] > 0
    assert torch.equal(model.mlps[1][0].weight, untouched["mlps.1.0.weight"])  # the probe ran on a copy
    assert model.mlps[0][0].weight.shape == (16, 4) and model.mlps[1][0].weight.shape == (8, 4)


def test_a_model_without_mlps_is_refused():
    from clbench.errors import UserError
    from clbench.engine.module import ContinualModule
    from clbench.strategies.grow import Grow

    strategy = Grow()
    module = ContinualModule(nn.Linear(3, 2), strategy, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                             num_classes=2)
    with pytest.raises(UserError, match="no MLP"):
        strategy.setup(module.context, [], seed=0)
        strategy.adapt_model(module.context, 0)


@pytest.mark.filterwarnings("ignore:You defined a `validation_step`", "ignore:The 'train_dataloader' does not have",
                            "ignore:`isinstance\\(treespec", "ignore:Found .* in eval mode")
def test_a_causal_lm_grows_its_top_mlp_and_keeps_its_originals(tmp_path):
    """Qwen3 (gated MLPs) under the causal-LM objective: the probe ranks both MLPs, one grows,
    the logits are unchanged by the growth and gate/up/down originals stay bit for bit."""
    from lm_helpers import build, logits, stream, train

    from clbench.strategies.grow import Grow

    experiences = stream(8)
    strategy = Grow(top_n=1, probe_steps=2, probe_batch_size=4)
    module = build(strategy, experiences)
    train(module, experiences[0], steps=2)
    before_logits = logits(module, experiences[0])
    before = {n: p.detach().clone() for n, p in module.model.named_parameters()}
    strategy.adapt_model(module.context, experiences[1].position + 1)
    strategy.before_experience(module.context, experiences[1])
    record = strategy.growths[0]
    assert len(record["layers"]) == 1 and set(record["scores"]) == {"hf.model.layers.0.mlp", "hf.model.layers.1.mlp"}
    assert (logits(module, experiences[0]) - before_logits).abs().max().item() <= 1e-5
    grown = record["layers"][0]
    p = record["widths"][0]
    strategy.before_experience = lambda module, experience: None  # grown already, above
    train(module, experiences[1], steps=2)
    after = dict(module.model.named_parameters())
    for proj in ("gate_proj", "up_proj"):
        name = f"{grown}.{proj}.weight"
        assert torch.equal(after[name][:p], before[name])
        assert not torch.equal(after[name][p:], before[name])  # the copies trained
    down = f"{grown}.down_proj.weight"
    assert torch.equal(after[down][:, :p], before[down] / 2)
    assert all(torch.equal(after[n], before[n]) for n in before if not n.startswith(grown))
