"""The engine beyond classification: objectives, model-side losses and routing, parameters that
appear mid-stream, strategies that own their update, and the run's output directory."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch
from helpers import crash_at, tiny_config

from clbench.errors import UserError

REGRESSION_STREAM = '''
import torch
from torch.utils.data import TensorDataset
from clbench.data.streams import StreamSpec, build_scenario


def linear_tasks(tasks: int = 3, dim: int = 4, n: int = 256, seed: int = 0):
    """Noise-free linear regression, one random ground truth per experience."""
    g = torch.Generator().manual_seed(seed)
    train, test = [], []
    for _ in range(tasks):
        w = torch.randn(dim, generator=g)
        for split, size in ((train, n), (test, n // 2)):
            x = torch.randn(size, dim, generator=g)
            split.append(TensorDataset(x, x @ w))
    spec = StreamSpec(name="linear-tasks", input_shape=(dim,), objective="regression")
    return build_scenario(spec, train, test, [f"task{i}" for i in range(tasks)], targets=False)


class Linear(torch.nn.Module):
    def __init__(self, input_shape, output_dim):
        super().__init__()
        self.fc = torch.nn.Linear(input_shape[0], output_dim)

    def forward(self, x):
        return self.fc(x)
'''


def _regression_config(tmp_path, **overrides) -> dict:
    from clbench.config.load import resolve_config

    plugin = tmp_path / "linear_stream.py"
    plugin.write_text(REGRESSION_STREAM)
    raw = tiny_config(benchmark={"class_path": f"{plugin}:linear_tasks", "init_args": {}},
                      model={"class_path": f"{plugin}:Linear", "init_args": {}},
                      train={"epochs": 5, "batch_size": 32,
                             "optimizer": {"class_path": "sgd", "init_args": {"lr": 0.05}}})
    raw["model"]["init_args"] = {}  # tiny_config's MLP arguments do not apply
    return resolve_config({**raw, **overrides})


def test_a_lower_is_better_objective_runs_end_to_end_and_scores_in_its_direction(tmp_path):
    """A regression stream: R holds mean squared errors, and the CL scores read them as errors."""
    from clbench.metrics import cl_scores
    from clbench.metrics.scores import score_higher_is_better
    from clbench.engine.runner import run

    result = run(_regression_config(tmp_path), tmp_path / "out")
    r, r_init = result["r_matrix"], result["r_init"]
    assert result["r_metric"] == {"names": ["mse"] * 3, "higher_is_better": False}
    assert result["objective"]["name"] == "Regression"
    # training on an experience lowers its error well below the untrained model's
    assert all(r[j][j] < 0.5 * r_init[j] for j in range(3))
    # sequential training on different ground truths raises the error on old tasks
    assert r[-1][0] > r[0][0]
    assert result["scores"] == pytest.approx(cl_scores(r, r_init=r_init, higher_is_better=False), nan_ok=True)
    assert result["scores"]["forgetting"] > 0 and not score_higher_is_better("forgetting", False)
    assert result["scores"]["bwt"] < 0  # the error on old tasks grew
    assert result["scores"]["cl_score"] is None  # undefined for an unbounded error
    saved = json.loads((tmp_path / "out" / "result.json").read_text())
    assert saved["r_matrix"] == r


def test_a_config_can_override_the_streams_objective(tmp_path):
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    plain = run(resolve_config(tiny_config()), None)
    assert {"gmean", "mauc"} <= set(plain["matrices"])
    quick = run(resolve_config(tiny_config(objective={"class_path": "classification",
                                                      "init_args": {"imbalance": False}})), None)
    assert set(quick["matrices"]) == set()
    assert quick["r_matrix"] == plain["r_matrix"]


AUX_MODEL = '''
import torch
from clbench.models import auxiliary


class Penalised(torch.nn.Module):
    """An MLP whose hidden layer adds a weight penalty from inside its forward pass."""

    def __init__(self, num_classes, input_shape, weight: float = 1.0):
        super().__init__()
        size = 1
        for d in input_shape:
            size *= d
        self.hidden = torch.nn.Linear(size, 16)
        self.out = torch.nn.Linear(16, num_classes)
        self.weight = weight

    def forward(self, x):
        h = self.hidden(x.flatten(1))
        auxiliary.add("penalty", self.weight * self.hidden.weight.pow(2).sum())
        return self.out(torch.relu(h))
'''


def test_an_auxiliary_loss_from_inside_the_model_reaches_the_gradient_and_the_log(tmp_path):
    import importlib.util

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from clbench.config.load import resolve_config
    from clbench.engine.module import ContinualModule
    from clbench.engine.runner import run
    from clbench.strategy import Strategy

    plugin = tmp_path / "penalised.py"
    plugin.write_text(AUX_MODEL)
    spec = importlib.util.spec_from_file_location("penalised", plugin)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # The training step's loss is the task loss plus the term, and its gradient has both.
    torch.manual_seed(0)
    model = mod.Penalised(num_classes=3, input_shape=(5,), weight=0.5)
    module = ContinualModule(model, Strategy(), optimizer=lambda p: torch.optim.SGD(p, lr=0.1), num_classes=3)
    x, y = torch.randn(8, 5), torch.randint(0, 3, (8,))
    loss = module.training_step((x, y), 0)
    task = torch.nn.functional.cross_entropy(model(x), y)
    assert loss.item() == pytest.approx(task.item() + 0.5 * model.hidden.weight.pow(2).sum().item(), rel=1e-6)
    loss.backward()
    with_term = model.hidden.weight.grad.clone()
    model.zero_grad()
    task.backward()
    assert torch.allclose(with_term - model.hidden.weight.grad, 2 * 0.5 * model.hidden.weight.detach(), atol=1e-6)
    # Outside training the call does nothing (evaluation adds no terms anywhere).
    with torch.no_grad():
        model(x)
    # Through the runner, the term is logged per epoch under train/aux/<name>.
    cfg = resolve_config(tiny_config(model={"class_path": f"{plugin}:Penalised", "init_args": {"weight": 0.01}},
                                     logging={"tensorboard": True}))
    cfg["model"]["init_args"] = {"weight": 0.01}
    run(cfg, tmp_path / "out")
    events = EventAccumulator(str(tmp_path / "out" / "tensorboard"))
    events.Reload()
    assert "train/aux/penalty" in events.Tags()["scalars"]
    assert all(e.value > 0 for e in events.Scalars("train/aux/penalty"))


ROUTED_MODEL = '''
import torch
from clbench.models import routing_channel as routing


class Routed(torch.nn.Module):
    """Two experts chosen per sample by the sign of the input's mean: a fixed, known router."""

    records_routing = True
    num_experts = 2

    def __init__(self, num_classes, input_shape):
        super().__init__()
        size = 1
        for d in input_shape:
            size *= d
        self.experts = torch.nn.ModuleList(torch.nn.Linear(size, num_classes) for _ in range(2))

    def forward(self, x):
        x = x.flatten(1)
        choice = (x.mean(1) > x.mean()).long()
        routing.record(self, experts=choice[:, None])
        out = torch.stack([e(x) for e in self.experts], 1)
        return out[torch.arange(len(x)), choice]
'''


def test_routing_is_recorded_while_each_experience_trains_and_at_evaluation(tmp_path):
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    plugin = tmp_path / "routed.py"
    plugin.write_text(ROUTED_MODEL)
    cfg = resolve_config(tiny_config(model={"class_path": f"{plugin}:Routed"}, train={"epochs": 2}))
    cfg["model"]["init_args"] = {}
    result = run(cfg, None)
    train = result["train_expert_utilization"]
    assert len(train) == 3  # one record per experience
    domains = []
    for record in train:
        (layer, figures), = record.items()
        utilization = torch.tensor([[v or 0.0 for v in row] for row in figures["utilization"]])
        # while an experience trains, only its domain's row is filled, and it sums to 1
        filled = [d for d in range(len(utilization)) if utilization[d].sum() > 0]
        assert len(filled) == 1 and utilization[filled[0]].sum().item() == pytest.approx(1.0)
        domains.append(filled[0])
    assert len(set(domains)) == 3
    assert len(result["expert_utilization"]) == 3


GROWING_STRATEGY = '''
import torch
from clbench import Strategy


class Grows(Strategy):
    """Adds a residual linear layer before every experience after the first, and one more in
    the middle of the second experience (after its third optimizer step)."""

    def __init__(self):
        super().__init__()
        self.added = 0  # layers in the model
        self.recorded = 0  # layers the checkpoint's model had (a resume replays them)
        self.opened = 0  # the last experience that began with a new layer
        self.steps = 0
        self.initial = {}

    def _add(self, ctx):
        head = _head(ctx.model)
        layer = torch.nn.Linear(head.out_features, head.out_features)
        torch.nn.init.zeros_(layer.weight)
        torch.nn.init.zeros_(layer.bias)
        head.extra.append(layer)
        self.added += 1
        self.initial[self.added - 1] = layer.weight.detach().clone()

    def adapt_model(self, ctx, upto):
        while self.added < self.recorded:
            self._add(ctx)
        if upto - 1 > self.opened:  # experience upto - 1 (after the first) begins with a new layer
            self._add(ctx)
            self.opened = upto - 1

    def before_experience(self, ctx, experience):
        self.steps = 0

    def after_optimizer_step(self, ctx):
        self.steps += 1
        if ctx.experience == 1 and self.steps == 3:
            self._add(ctx)
            ctx.rebuild_optimizer()

    def after_experience(self, ctx, experience):
        if experience.position == 1:  # the layer added mid-experience has trained by now
            self.at_end_of_second = _head(ctx.model).extra[1].weight.detach().clone()

    def state_dict(self):
        return {"added": self.added, "opened": self.opened}

    def load_state_dict(self, state):
        self.recorded, self.opened = state["added"], state["opened"]


def _head(model):
    """The model's last linear layer, with a list of residual layers applied to its output."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    for m in linears:
        if hasattr(m, "extra"):
            return m
    head = linears[-1]
    head.extra = torch.nn.ModuleList()
    head.register_forward_hook(lambda m, args, out: out + sum(layer(out) for layer in m.extra))
    return head
'''


def test_parameters_added_mid_stream_are_trained_and_restored_after_a_crash(tmp_path, monkeypatch):
    """Layers appear before experiences and inside one (the optimizer is rebuilt over them);
    a run crashed after they appeared resumes to the uninterrupted result."""
    from clbench.config.load import resolve_config
    from clbench.engine.runner import ContinualRun, run

    plugin = tmp_path / "grows.py"
    plugin.write_text(GROWING_STRATEGY)
    cfg = resolve_config(tiny_config(strategy={"class_path": f"{plugin}:Grows"},
                                     train={"epochs": 2, "batch_size": 32}))
    complete = ContinualRun(cfg, tmp_path / "reference")
    reference = complete.execute()
    grown = [m for m in complete.parts.module.model.modules() if hasattr(m, "extra")][0].extra
    assert len(grown) == 3  # before experiences 2 and 3, and inside experience 2
    for k, layer in enumerate(grown):
        assert not torch.equal(layer.weight.detach(), complete.parts.strategy.initial[k]), f"layer {k} was not trained"
    assert not torch.equal(complete.parts.strategy.at_end_of_second, complete.parts.strategy.initial[1])  # rebuilt optimizer
    assert reference["model"]["params_total"] > 3466

    crash_at(monkeypatch, "stage:2:step:5", cfg, tmp_path / "crashed")
    resumed = run(cfg, tmp_path / "crashed", resume=True)
    assert resumed["r_matrix"] == reference["r_matrix"]
    assert resumed["model"]["params_total"] == reference["model"]["params_total"]


MANUAL_STRATEGY = '''
import torch
from clbench.strategy import Strategy


class SignSGD(Strategy):
    """Owns its update (Lightning manual optimisation): a sign-SGD step of fixed size."""

    owns_update = True

    def __init__(self, step: float = 0.002):
        super().__init__()
        self.step = step
        self.updates = 0

    def update(self, ctx, batch):
        inputs, targets = ctx.objective.split(batch)
        loss = ctx.objective.loss_of(ctx.model, inputs, targets)
        params = [p for p in ctx.model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= self.step * g.sign()
        self.updates += 1
        return loss.detach()

    def state_dict(self):
        return {"updates": self.updates}

    def load_state_dict(self, state):
        self.updates = state["updates"]
'''


def test_a_strategy_that_owns_its_update_learns_and_resumes(tmp_path, monkeypatch):
    from clbench.config.load import resolve_config
    from clbench.engine.runner import ContinualRun, run

    plugin = tmp_path / "signsgd.py"
    plugin.write_text(MANUAL_STRATEGY)
    cfg = resolve_config(tiny_config(strategy={"class_path": f"{plugin}:SignSGD"},
                                     train={"epochs": 2, "batch_size": 32}))
    complete = ContinualRun(cfg, tmp_path / "reference")
    reference = complete.execute()
    assert complete.parts.strategy.updates > 0
    assert all(reference["r_matrix"][j][j] > reference["r_init"][j] + 0.2 for j in range(3))
    crash_at(monkeypatch, "stage:1:step:4", cfg, tmp_path / "crashed")
    assert run(cfg, tmp_path / "crashed", resume=True)["r_matrix"] == reference["r_matrix"]


FAILING_STRATEGY = '''
from clbench.strategy import Strategy


class FailsLate(Strategy):
    def after_experience(self, ctx, experience):
        if experience.position == 1:
            raise RuntimeError("simulated failure after the second experience")
'''


def test_a_failed_overwrite_keeps_the_previous_run_and_a_successful_one_replaces_it(tmp_path):
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    out = tmp_path / "out"
    run(resolve_config(tiny_config(logging={"tensorboard": True})), out)
    before = (out / "result.json").read_bytes()
    events_before = sorted(p.name for p in (out / "tensorboard").iterdir())
    plugin = tmp_path / "fails.py"
    plugin.write_text(FAILING_STRATEGY)
    failing = resolve_config(tiny_config(strategy={"class_path": f"{plugin}:FailsLate"},
                                         logging={"tensorboard": True}))
    # a plugin's hook that raises is reported as its file and line (clbench.plugins.hooks)
    with pytest.raises(UserError, match=r"fails\.py:\d+: RuntimeError: simulated failure"):
        run(failing, out, overwrite=True)
    assert (out / "result.json").read_bytes() == before
    assert sorted(p.name for p in (out / "tensorboard").iterdir()) == events_before
    # the failed replacement's last checkpoint waits in the staging folder, for --resume
    assert sorted(p.name for p in (out / ".staging").iterdir()) == ["checkpoint.pt", "tensorboard"]
    replacement = run(resolve_config(tiny_config(seed=1)), out, overwrite=True)
    assert json.loads((out / "result.json").read_text())["seed"] == replacement["seed"] == 1
    assert sorted(p.name for p in out.iterdir()) == ["model", "result.json"]  # the old run's logs went with it


def test_a_run_that_fails_before_its_first_checkpoint_leaves_no_directory(tmp_path):
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    plugin = tmp_path / "fails.py"
    plugin.write_text(FAILING_STRATEGY.replace("experience.position == 1", "True"))
    out = tmp_path / "never"
    with pytest.raises(UserError, match="RuntimeError: simulated failure"):
        run(resolve_config(tiny_config(strategy={"class_path": f"{plugin}:FailsLate"},
                                       logging={"tensorboard": True})), out)
    assert not out.exists()


def _flip_tensor_bytes(path, count: int = 64) -> None:
    """Flip ``count`` bytes inside the largest tensor record of a torch.save zip file."""
    with zipfile.ZipFile(path) as archive:
        record = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    header = record.header_offset
    name_len = int.from_bytes(data[header + 26:header + 28], "little")
    extra_len = int.from_bytes(data[header + 28:header + 30], "little")
    start = header + 30 + name_len + extra_len + record.file_size // 2
    for i in range(start, start + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_checkpoint_whose_tensor_bytes_changed_is_refused_by_its_checksum(tmp_path, monkeypatch):
    from clbench.config.load import resolve_config
    from clbench.errors import UserError
    from clbench.engine.runner import run

    cfg = resolve_config(tiny_config())
    crash_at(monkeypatch, "stage:2:step:1", cfg, tmp_path / "out")
    path = tmp_path / "out" / "checkpoint.pt"
    _flip_tensor_bytes(path)
    with pytest.raises(UserError, match="fails its checksum") as caught:
        run(cfg, tmp_path / "out", resume=True)
    assert "\n" not in str(caught.value)
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 3])
    with pytest.raises(UserError, match="truncated|scrambled"):
        run(cfg, tmp_path / "out", resume=True)


@pytest.mark.parametrize("trainer, field", [({"precision": 7}, "trainer.precision"),
                                            ({"accelerator": "gpu"}, "trainer.accelerator"),
                                            ({"accelerator": "cpu", "strategy": "fsdp_cpu_offload"}, "trainer.accelerator")])
def test_trainer_settings_lightning_refuses_are_one_line_naming_the_field(trainer, field, tmp_path):
    from clbench.config.load import resolve_config
    from clbench.errors import UserError
    from clbench.engine.runner import run

    if trainer.get("accelerator") == "gpu" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(UserError) as caught:
        run(resolve_config(tiny_config(trainer=trainer)), tmp_path / "out")
    assert caught.value.where.endswith(field)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "out").exists()


FROZEN_BASE = '''
import torch
from clbench.models.factories import mlp
from clbench.strategy import Strategy


def from_file(path, num_classes, input_shape):
    """An MLP whose weights are read from a file, as a pretrained base is."""
    model = mlp(num_classes=num_classes, input_shape=input_shape, hidden=32)
    model.load_state_dict(torch.load(path, weights_only=True))
    return model


class FrozenWithAdapter(Strategy):
    """Freezes the base and trains a residual linear adapter on its output (set up on every build)."""

    def adapt_model(self, ctx, upto):
        model = ctx.model
        if hasattr(model, "adapter"):
            return
        for p in model.parameters():
            p.requires_grad_(False)
        k = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1].out_features
        model.adapter = torch.nn.Linear(k, k)
        torch.nn.init.zeros_(model.adapter.weight)
        torch.nn.init.zeros_(model.adapter.bias)
        model.register_forward_hook(lambda m, args, out: out + m.adapter(out))
'''


def test_a_frozen_base_stays_out_of_checkpoints_and_must_match_on_resume(tmp_path, monkeypatch):
    from clbench.config.load import resolve_config
    from clbench.errors import UserError
    from clbench.models.factories import mlp
    from clbench.engine.runner import run

    plugin = tmp_path / "frozen.py"
    plugin.write_text(FROZEN_BASE)
    weights = tmp_path / "base.pt"
    torch.manual_seed(1)
    base = mlp(num_classes=10, input_shape=(1, 8, 8), hidden=32).state_dict()
    torch.save(base, weights)
    cfg = resolve_config(tiny_config(model={"class_path": f"{plugin}:from_file"},
                                     strategy={"class_path": f"{plugin}:FrozenWithAdapter"}))
    cfg["model"]["init_args"] = {"path": str(weights)}
    reference = run(cfg, tmp_path / "reference")
    assert reference["r_matrix"][0][0] != reference["r_init"][0]  # the adapter learned something

    crash_at(monkeypatch, "stage:2:step:1", cfg, tmp_path / "crashed")
    ckpt = torch.load(tmp_path / "crashed" / "checkpoint.pt", weights_only=True)
    assert sorted(ckpt["model"]) == ["adapter.bias", "adapter.weight"]
    assert sorted(ckpt["frozen_base"]["names"]) == sorted(base)
    resumed = run(cfg, tmp_path / "crashed", resume=True)
    assert resumed["r_matrix"] == reference["r_matrix"]

    crash_at(monkeypatch, "stage:2:step:1", cfg, tmp_path / "changed")
    torch.save({k: v + 1e-3 for k, v in base.items()}, weights)  # another base under the same path
    with pytest.raises(UserError, match="frozen weights differ"):
        run(cfg, tmp_path / "changed", resume=True)


def test_tensorboard_gets_one_event_stream_per_run_with_hparams_and_final_scores(tmp_path):
    import yaml
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    result = run(resolve_config(tiny_config(logging={"tensorboard": True})), tmp_path / "out")
    folder = tmp_path / "out" / "tensorboard"
    events = list(folder.glob("events.out.tfevents.*"))
    assert len(events) == 1  # three experiences, one stream
    hparams = yaml.safe_load((folder / "hparams.yaml").read_text())
    assert hparams["strategy.class_path"] == "naive" and hparams["order_label"] == result["order_label"]
    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    scalars = accumulator.Tags()["scalars"]
    assert "scores/acc" in scalars and "train/loss" in scalars and not any(t.startswith("final/") for t in scalars)
    assert accumulator.Scalars("scores/acc")[0].value == pytest.approx(result["scores"]["acc"])


def test_tensorboard_draws_a_utilization_heatmap_per_moe_layer_and_stage(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from clbench.config.load import resolve_config
    from clbench.engine.runner import run

    model = {"class_path": "vit_moe", "init_args": {"label": "MoE", "patch_size": 4, "embed_dim": 16, "depth": 2,
                                                    "num_heads": 2, "mlp_ratio": 2.0, "moe_blocks": [0, 1]}}
    result = run(resolve_config(tiny_config(model=model, logging={"tensorboard": True})), tmp_path / "out")
    layers = sorted(result["expert_utilization"][-1])
    assert len(layers) == 2 and len(result["route_compositions"]) == 3
    accumulator = EventAccumulator(str(tmp_path / "out" / "tensorboard"), size_guidance={"images": 0})
    accumulator.Reload()
    images = accumulator.Tags()["images"]
    for layer in layers:
        assert [event.step for event in accumulator.Images(f"routing/{layer}")] == [0, 1, 2]
    assert "r_matrix" in images


LR_RECORDING = '''
from clbench.strategies.replay import Replay


class Recording(Replay):
    """Replay that notes the learning rate of every optimizer step, per experience."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.rates = {}

    def before_optimizer_step(self, ctx, optimizer):
        super().before_optimizer_step(ctx, optimizer)
        self.rates.setdefault(ctx.experience, []).append(optimizer.param_groups[0]["lr"])
'''


@pytest.mark.parametrize("mem_size", [0, 60])
def test_each_experiences_schedule_spans_exactly_its_optimizer_steps(tmp_path, mem_size):
    """A linear decay to 0 over each experience: the rate of step k of N is lr·(1 - k/N), so the
    last step runs at lr/N, whether the loader is plain or replay's combined one (whose length
    Lightning counts by its mode). A schedule sized to the wrong number of steps (1, or the
    whole run's) would reach 0 early or stop part way."""
    from clbench.config.load import resolve_config
    from clbench.engine.runner import ContinualRun

    plugin = tmp_path / "recording.py"
    plugin.write_text(LR_RECORDING)
    lr = 0.01
    cfg = resolve_config(tiny_config(
        strategy={"class_path": f"{plugin}:Recording", "init_args": {"mem_size": mem_size}},
        train={"epochs": 2, "batch_size": 64, "optimizer": {"class_path": "sgd", "init_args": {"lr": lr}},
               "scheduler": {"class_path": "linear"}}))
    run = ContinualRun(cfg, None)
    run.execute()
    rates = run.parts.strategy.rates
    assert sorted(rates) == [0, 1, 2]
    for stage, seen in rates.items():
        steps = len(seen)
        assert steps >= 4, stage
        assert seen == pytest.approx([lr * (1 - k / steps) for k in range(steps)], rel=1e-6), stage
