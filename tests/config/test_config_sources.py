"""Every hyper-parameter of an experiment config says where it comes from: a table, appendix or
section of the paper it reproduces, or "our choice".

``configs/experiments/*.yaml`` reproduce the seeds' settings, so a value there is either the
paper's (and the comment on its line names where the paper gives it) or not (and the comment
says "our choice", with why). The configs are read line by line, since YAML parsers drop
comments:

* **Hyper-parameters** are the scalar values (a one-line list such as ``betas: [0.9, 0.95]``
  counts as one value) at any depth under ``train`` (optimizer and scheduler included),
  ``pretrain``, and the ``init_args`` of ``model``, ``strategy``, ``benchmark`` and
  ``objective``, except paths (keys ``root`` and ``path``: where the data and weights are on
  one machine, no setting of the experiment).
* **A source** is a comment on the value's own line that names a part of a document
  (``Table 1``, ``App. A.3.4``, ``Appendix B``, ``Sec. 5.3``, ``§3.1``, ``Fig. 4.1``, ``Eq. 5``,
  ``Algorithm 1``) or says ``our choice``.
* So that every value has a line of its own, mappings in those sections are written in block
  style (one ``key: value`` per line); a flow mapping (``{lr: 0.001}``) there is refused.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "experiments").glob("*.yaml"))
SECTIONS = (("train",), ("pretrain",), ("model", "init_args"), ("strategy", "init_args"), ("benchmark", "init_args"),
            ("objective", "init_args"))
PATH_KEYS = {"root", "path"}
SOURCE = re.compile(r"\b(?:Tables?|Tab\.|Appendix|App\.|Section|Sec\.|Fig\.|Figure|Eq\.|Algorithm|Alg\.)\s+[A-Z0-9]"
                    r"|§\s*[A-Z0-9]|\b[Oo]ur choice\b")
_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?: +(?P<value>.*))?$")


def _split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of a YAML line: the comment starts at a '#' after a space, outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def scan(text: str) -> list[tuple[tuple[str, ...], int, str, str]]:
    """(key path, line number, value, comment) of every ``key: value`` line; block style only."""
    found, stack = [], []  # stack: (indent, key) of the open mappings
    for number, line in enumerate(text.splitlines(), 1):
        code, comment = _split_comment(line)
        if not code.strip():
            continue
        match = _LINE.match(code)
        if match is None:
            raise AssertionError(f"line {number}: {code.strip()!r} is not one 'key: value' (write the config in block "
                                 "style, one key per line, a list on one line)")
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = tuple(k for _, k in stack) + (match["key"],)
        if match["value"]:
            found.append((path, number, match["value"], comment))
        else:
            stack.append((indent, match["key"]))
    return found


def _leaves(node, path=()) -> list[tuple[str, ...]]:
    if isinstance(node, dict):
        return [leaf for key, value in node.items() for leaf in _leaves(value, path + (str(key),))]
    return [path]


def is_hyper_parameter(path: tuple[str, ...]) -> bool:
    return path[-1] not in PATH_KEYS and any(path[:len(s)] == s and len(path) > len(s) for s in SECTIONS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_hyper_parameter_names_its_source(path):
    text = path.read_text()
    lines = scan(text)
    problems = []
    for keys, number, value, comment in lines:
        if not is_hyper_parameter(keys):
            continue
        if value.startswith("{"):
            problems.append(f"line {number}: {'.'.join(keys)} is a flow mapping: write one key per line")
        elif not SOURCE.search(comment):
            problems.append(f"line {number}: {'.'.join(keys)}: {value} has neither a source (Table/App./Sec./§ ...) "
                            "nor 'our choice' in its comment")
    scanned = {keys for keys, *_ in lines}
    parsed = {leaf for leaf in _leaves(yaml.safe_load(text)) if is_hyper_parameter(leaf)}
    problems += [f"{'.'.join(leaf)} is not on a line of its own" for leaf in sorted(parsed - scanned)]
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


def test_the_checker_catches_what_it_should():
    text = ("train:\n  epochs: 2  # App. A.3.4\n  batch_size: 10\n"
            "  optimizer:\n    class_path: adamw  # our choice\n    init_args: {lr: 0.1}\n"
            "benchmark:\n  init_args:\n    root: /data\n")
    lines = {keys: comment for keys, _, _, comment in scan(text)}
    assert SOURCE.search(lines[("train", "epochs")]) and not SOURCE.search(lines[("train", "batch_size")])
    assert is_hyper_parameter(("train", "optimizer", "init_args"))
    assert not is_hyper_parameter(("benchmark", "init_args", "root")) and not is_hyper_parameter(("seed",))
    assert not SOURCE.search("the paper's") and not SOURCE.search("Tablet 7") and SOURCE.search("Table 7")
    with pytest.raises(AssertionError, match="block style"):
        scan("a:\n  - 1\n")
