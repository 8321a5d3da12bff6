"""The model arguments the harness supplies: one list, the built-in objectives' own, and a run
checks exactly its objective's where it is known before the stream is built."""

import pytest
from helpers import tiny_config

from clbench.config.load import resolve_config
from clbench.errors import UserError
from clbench import registry
from clbench.plugins.build import preflight
from clbench.plugins.describe import SUPPLIED_BY_HARNESS
from clbench.plugins.supplied import MODEL_ARGS


def test_the_list_is_what_the_builtin_objectives_supply():
    supplied = set()
    for name in registry.available("objectives"):
        supplied |= set(registry.resolve("objectives", name).model_args)
    assert set(MODEL_ARGS) == supplied
    assert SUPPLIED_BY_HARNESS["models"] == frozenset(MODEL_ARGS)


MODEL = '''
import torch


def net(num_classes, input_shape, output_dim: int = 3):
    """A classifier with an output_dim of its own (classification does not supply one)."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(num_classes))
'''


def test_a_classification_run_may_set_output_dim_but_not_num_classes(tmp_path):
    (tmp_path / "net.py").write_text(MODEL)
    target = f"{tmp_path / 'net.py'}:net"
    preflight(resolve_config(tiny_config(model={"class_path": target, "init_args": {"output_dim": 5}})), "cfg.yaml")
    with pytest.raises(UserError) as info:
        preflight(resolve_config(tiny_config(model={"class_path": target, "init_args": {"num_classes": 5}})),
                  "cfg.yaml")
    assert info.value.one_line().startswith("cfg.yaml: model.init_args.num_classes: 'num_classes' is set by the harness")
