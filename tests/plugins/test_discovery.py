"""Discovery: `clbench list` describes every component, `-v` and `clbench show` give their
hyper-parameters from the source, and tables name a strategy from a file by its class."""

from __future__ import annotations

import re
import textwrap

import pytest

from clbench.cli.main import main
from clbench.plugins.describe import arg_docs, describe, first_sentence
from clbench.leaderboard.table import build_tables
from clbench.registry import KINDS, available, display_name
from helpers import fake_entry, typed_entries

PLUGIN = '''
from clbench.strategy import Strategy


class Base(Strategy):
    """A base defined beside it.

    Args:
        strength: how hard to pull, a long description that
            continues on the next line.
        mode: ``a`` or ``b``.
    """

    def __init__(self, strength: float = 1.0, mode: str = "a", *, steps: int):
        super().__init__()


class Child(Base):
    """Inherits its signature from Base. Second sentence."""
'''


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")


def test_every_builtin_has_a_description():
    for kind in KINDS:
        for name, target in available(kind).items():
            assert describe(kind, name, target).summary, f"{kind} '{name}' ({target}) has no docstring summary"


def test_list_verbose_shows_types_and_defaults(wide, capsys):
    assert main(["list", "strategies", "-v"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"ewc_lambda: float >= 0 = 100\.0", out)  # the range declared in the signature
    assert "mode: Literal['separate', 'online'] = 'separate'" in out
    assert "Elastic Weight Consolidation" in out
    assert "digits-domains" not in out  # one kind only


def test_show_reads_a_plugin_file_following_its_base(tmp_path, wide, capsys):
    path = tmp_path / "plugin.py"
    path.write_text(PLUGIN)
    assert main(["show", f"{path}:Child"]) == 0
    out = capsys.readouterr().out
    assert "Inherits its signature from Base." in out and "Second sentence" not in out
    assert "strength: float (default 1.0)" in out
    assert "how hard to pull, a long description that continues on the next line." in out
    assert "steps: int (required)" in out
    assert "a or b." in out  # inline literals shown plainly


def test_show_finds_a_short_name_in_every_kind(wide, capsys):
    assert main(["show", "hf_causal_lm"]) == 0
    out = capsys.readouterr().out
    assert "hf_causal_lm (model, clbench.models.lm.causal_lm:hf_causal_lm)" in out
    assert "architecture: str | None (default None)" in out
    assert main(["show", "mlp"]) == 0
    assert "num_classes" not in capsys.readouterr().out


def test_show_of_an_unknown_name_is_one_line(capsys):
    assert main(["show", "ewk"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown component 'ewk'" in err and "did you mean 'ewc'" in err


def test_docstring_parsing():
    assert first_sentence("Replay. With a buffer.\n\nMore.") == "Replay."
    assert first_sentence("A summary\nover two lines\n\nbody") == "A summary over two lines"
    doc = textwrap.dedent("""\
        Summary.

        Args:
            k: the factor.
            layers (list): which layers,
                in order.
            **extra: passed on.

        Returns:
            nothing
        """)
    assert arg_docs(doc) == {"k": "the factor.", "layers": "which layers, in order.", "extra": "passed on."}


def test_a_strategy_from_a_file_is_labelled_by_its_class(tmp_path):
    assert display_name("naive") == "naive"
    assert display_name("my_pkg.methods:SI") == "SI" == display_name("path/to/si.py:SI")
    assert display_name("my_pkg.methods.SI") == "SI"
    (tmp_path / "si.py").write_text(PLUGIN)
    entries = [fake_entry("naive", "default", 0, 0.5), fake_entry(f"{tmp_path / 'si.py'}:SI", "default", 0, 0.7)]
    (table,) = build_tables(typed_entries(entries))
    assert sorted(row.label for row in table.rows) == ["SI", "naive"]
