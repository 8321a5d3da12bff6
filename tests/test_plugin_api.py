"""The public plugin API: what strategies may import, what their hooks receive, what they declare."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from helpers import REPO, tiny_config

import clbench


def _clbench_imports(source: str) -> list[tuple[str, list[str]]]:
    """(module, names) of every import of clbench in ``source``, at any depth (TYPE_CHECKING too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "clbench":
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names if alias.name.split(".")[0] == "clbench"]
    return found


def _private(source: str) -> list[str]:
    """Imports of ``source`` outside the public API (``clbench.__all__`` and ``clbench.PUBLIC_MODULES``)."""
    bad = []
    for module, names in _clbench_imports(source):
        if module == "clbench":
            bad += [f"clbench.{name}" for name in names if name not in clbench.__all__]
        elif not any(module == public or module.startswith(public + ".") for public in clbench.PUBLIC_MODULES):
            bad.append(module)
    return bad


STRATEGY_FILES = sorted((REPO / "clbench" / "strategies").glob("*.py"))


@pytest.mark.parametrize("path", STRATEGY_FILES, ids=[p.stem for p in STRATEGY_FILES])
def test_built_in_strategies_import_only_the_public_api(path: Path):
    assert _private(path.read_text()) == []


def test_the_example_strategy_and_the_readme_plugin_use_only_the_public_api():
    example = (REPO / "examples" / "my_strategy.py").read_text()
    readme = (REPO / "README.md").read_text()
    plugin = next(block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "(Strategy)" in block)
    for source in (example, plugin):
        assert _clbench_imports(source) and _private(source) == []


def test_every_public_name_and_module_imports():
    import importlib

    for name in clbench.__all__:
        assert getattr(clbench, name) is not None
    for module in clbench.PUBLIC_MODULES:
        importlib.import_module(module)


def test_the_plugin_api_modules_do_not_import_the_engine():
    """strategy.py and objectives/base.py describe the API; the engine implements it (no cycle)."""
    for path in ("clbench/strategy.py", "clbench/objectives/base.py"):
        modules = [module for module, _ in _clbench_imports((REPO / path).read_text())]
        assert not [m for m in modules if m.startswith("clbench.engine")], path


def test_a_hook_of_an_earlier_version_is_refused_with_its_new_name():
    from clbench import Strategy, UserError

    with pytest.raises(UserError, match=r"defines on_after_backward\(\), a hook that no longer exists "
                                        r"\(rename it after_backward\(\)"):
        class Old(Strategy):
            def on_after_backward(self, module):
                pass


def test_a_requirement_nothing_provides_is_refused():
    from clbench import Strategy, UserError

    with pytest.raises(UserError, match="requires telepathy"):
        class Odd(Strategy):
            requires = frozenset({"telepathy"})


HOOKS_STRATEGY = '''
from clbench import Strategy, StrategyContext


class Watches(Strategy):
    """Records what every hook received."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def _see(self, hook, ctx, *rest):
        assert isinstance(ctx, StrategyContext), type(ctx)
        self.seen.append((hook, ctx.experience, *rest))

    def setup(self, ctx, experiences, seed):
        super().setup(ctx, experiences, seed)
        self._see("setup", ctx)

    def adapt_model(self, ctx, upto):
        self._see("adapt_model", ctx, upto)

    def before_experience(self, ctx, experience):
        self._see("before_experience", ctx, experience.position)

    def training_loss(self, ctx, x, y, logits, loss):
        if not self.seen or self.seen[-1][0] != "training_loss":
            self._see("training_loss", ctx)
        return loss

    def after_experience(self, ctx, experience):
        self._see("after_experience", ctx, experience.position)
'''


def test_hooks_receive_the_context_in_order_with_the_experience_index(tmp_path):
    from clbench.config.load import resolve_config
    from clbench.engine.runner import ContinualRun

    plugin = tmp_path / "watches.py"
    plugin.write_text(HOOKS_STRATEGY)
    cfg = resolve_config(tiny_config(strategy={"class_path": f"{plugin}:Watches"}))
    run = ContinualRun(cfg, None)
    run.execute()
    seen = run.parts.strategy.seen
    expected = [("setup", 0), ("adapt_model", 0, 0)]
    for i in range(3):
        expected += [("adapt_model", i, i + 1), ("before_experience", i, i), ("training_loss", i),
                     ("after_experience", i, i)]
    assert seen == expected


def test_a_strategy_needing_a_language_model_is_refused_before_the_stream_is_built(monkeypatch):
    """moses on a digits stream: one line naming the config's strategy, no stream built."""
    from clbench.config.load import resolve_config
    from clbench.engine.runner import ContinualRun
    from clbench.errors import UserError
    from clbench.plugins import build

    def no_stream(*args, **kwargs):
        raise AssertionError("the stream was built")

    monkeypatch.setattr(build, "build_benchmark", no_stream)
    cfg = resolve_config(tiny_config(strategy={"class_path": "moses"}))
    with pytest.raises(UserError) as err:
        ContinualRun(cfg, None, source="run.yaml").execute()
    line = err.value.one_line()
    assert line.startswith("run.yaml: strategy.class_path: strategy 'moses' requires a causal language model")
    assert "benchmark 'digits-domains' (objective classification)" in line and "\n" not in line


def test_an_undeclared_objective_is_checked_once_the_stream_is_built(monkeypatch):
    """A benchmark that does not declare its objective: the same refusal, after the stream."""
    from clbench.config.load import resolve_config
    from clbench.engine.runner import ContinualRun
    from clbench.errors import UserError
    from clbench import registry

    resolve = registry.resolve

    def undeclared(kind, name, **kwargs):
        target = resolve(kind, name, **kwargs)
        if kind != "benchmarks":
            return target
        return lambda *args, **kw: target(*args, **kw)  # the same stream, without .objective

    monkeypatch.setattr(registry, "resolve", undeclared)
    cfg = resolve_config(tiny_config(strategy={"class_path": "moses"}))
    with pytest.raises(UserError, match=r"strategy 'moses' requires .* stream 'digits-domains' \(objective "
                                        r"classification\)"):
        ContinualRun(cfg, None).execute()


def test_the_model_protocol_hooks_are_called_where_a_model_has_them():
    from torch import nn

    from clbench import ContinualModel, RoutingLayer
    from clbench.models.protocol import begin_experience, has_routing_layers

    class Routed(nn.Module):
        records_routing = True
        num_experts = 2

        def __init__(self):
            super().__init__()
            self.begun = []

        def begin_experience(self, experience):
            self.begun.append(experience)

    model = nn.Sequential(nn.Linear(2, 2), Routed())
    begin_experience(model[1], "exp0")
    begin_experience(model[0], "exp0")  # no hook: nothing to call
    assert model[1].begun == ["exp0"]
    assert isinstance(model[1], ContinualModel) and not isinstance(model[0], ContinualModel)
    assert isinstance(model[1], RoutingLayer) and has_routing_layers(model) and not has_routing_layers(model[0])
