"""A run folder someone sends is input: ``clbench.load_model`` refuses, as one line naming the file,
the field and the fix, a saved config naming code that is not installed (at any depth, a module
in the working directory or inside the folder) unless ``trust_code=True``, and every tampered
file of the saved model. Nothing in the folder is changed."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import sys
from pathlib import Path

import pytest
import torch
from helpers import tiny_config

import clbench
from clbench.config.load import config_hash, resolve_config
from clbench.engine.saved_check import FIX
from clbench.errors import UserError


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """One finished EWC run (its state has tensors, so strategy.safetensors is not empty)."""
    from clbench.engine.runner import ContinualRun

    out = tmp_path_factory.mktemp("saved") / "run"
    ContinualRun(resolve_config(tiny_config(strategy={"class_path": "ewc"})), out).execute()
    return out


@pytest.fixture
def received(finished, tmp_path) -> Path:
    shutil.copytree(finished, tmp_path / "received")
    return tmp_path / "received"


def _final(run: Path) -> Path:
    return run / "model" / "final"


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _edit_manifest(run: Path, change, rehash: bool = False) -> None:
    path = _final(run) / "model.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    if rehash:  # as a forger would: the hash then matches the changed config
        manifest["config_hash"] = config_hash(resolve_config(manifest["config"]))
    path.write_text(json.dumps(manifest))


def _refused(run: Path, **kw) -> str:
    before = _snapshot(run)
    with pytest.raises(UserError) as err:
        clbench.load_model(run, **kw)
    assert "\n" not in str(err.value) and _snapshot(run) == before
    return str(err.value)


def _evil_module(folder: Path, marker: Path) -> tuple[str, Path]:
    name = f"evil_{hashlib.sha1(str(folder).encode()).hexdigest()[:8]}"
    file = folder / f"{name}.py"
    file.write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('x')\n"
                    "from clbench.strategies.naive import Naive\n\nclass Evil(Naive):\n    pass\n")
    return name, file


@pytest.mark.parametrize("bare", [False, True], ids=["class_path", "bare string"])
def test_a_module_shipped_in_the_folder_is_refused_unimported_and_runs_with_trust_code(
        received, tmp_path, monkeypatch, bare):
    marker = tmp_path / "imported"
    name, file = _evil_module(received, marker)
    monkeypatch.chdir(received)  # a script or notebook started in the received folder
    monkeypatch.syspath_prepend(str(received))
    named = f"{name}:Evil"
    _edit_manifest(received, lambda m: m["config"].update(
        strategy=named if bare else {"class_path": named, "init_args": {}}), rehash=True)
    try:
        message = _refused(received)
        field = "config.strategy" if bare else "config.strategy.class_path"
        assert message.startswith(f"{_final(received) / 'model.json'}: {field} is '{named}', which is not a "
                                  f"registered component of an installed package: loading it would import and run "
                                  f"{file}"), message
        assert "trust_code=True" in message
        assert not marker.exists() and name not in sys.modules
        model = clbench.load_model(received, trust_code=True)
        assert marker.exists() and isinstance(model, torch.nn.Module)
    finally:
        sys.modules.pop(name, None)


def test_a_python_file_nested_in_init_args_is_refused_unimported(received, tmp_path):
    marker = tmp_path / "imported"
    _, file = _evil_module(tmp_path, marker)
    _edit_manifest(received, lambda m: m["config"].update(benchmark={
        "class_path": "dirichlet", "init_args": {"source": {"class_path": f"{file}:Evil"}}}), rehash=True)
    message = _refused(received)
    assert f"model.json: config.benchmark.init_args.source.class_path is '{file}:Evil'" in message
    assert f"would import and run {file}" in message and not marker.exists()


def test_a_top_level_python_file_is_refused(received, tmp_path):
    marker = tmp_path / "imported"
    _, file = _evil_module(tmp_path, marker)
    _edit_manifest(received, lambda m: m["config"]["strategy"].update(class_path=f"{file}:Evil"))
    assert "config.strategy.class_path is" in _refused(received) and not marker.exists()


# -- tampered files ------------------------------------------------------------------------------------
def _header(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def _rewrite(path: Path, change) -> None:
    header, data = _header(path)
    names = [k for k in header if k != "__metadata__"]
    change(header, names)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def _huge_header(path: Path) -> None:
    path.write_bytes(struct.pack("<Q", 2**62) + path.read_bytes()[8:])


def _overlap(header, names):
    """Two tensors of the same size made to share their bytes (each one's own size still fits)."""
    size = {n: header[n]["data_offsets"][1] - header[n]["data_offsets"][0] for n in names}
    first, second = next((a, b) for a in names for b in names if a < b and size[a] == size[b])
    header[second]["data_offsets"] = header[first]["data_offsets"]


def _relabel(dtype):
    def change(header, names):
        header[names[0]]["dtype"] = dtype
    return change


def _manifest(change):
    return lambda folder: _edit_manifest(folder.parents[1], change)


W, S, M = "model.safetensors", "strategy.safetensors", "model.json"
TAMPERED = {  # case: (what to do to the final folder, file, field, what the message says)
    "header of 2^62 bytes": (lambda f: _huge_header(f / W), W, None, "header too large"),
    "strategy header of 2^62 bytes": (lambda f: _huge_header(f / S), S, None, "header too large"),
    "overlapping offsets": (lambda f: _rewrite(f / W, _overlap), W, None, "invalid offset"),
    "dtype relabelled (other size)": (lambda f: _rewrite(f / W, _relabel("F16")), W, None,
                                      "invalid shape, data type, or offset"),
    "dtype relabelled (same size)": (lambda f: _rewrite(f / W, _relabel("I32")), W, None,
                                     "holds torch.int32 (integer numbers), the rebuilt model's is torch.float32"),
    "truncated": (lambda f: (f / W).write_bytes((f / W).read_bytes()[:100]), W, None, "not a readable safetensors"),
    "missing weights": (lambda f: (f / W).unlink(), W, None, "cannot read: No such file or directory"),
    "missing key": (_manifest(lambda m: m.pop("experiences_trained")), M, "experiences_trained", "is missing"),
    "experiences 1e9": (_manifest(lambda m: m.update(experiences_trained=1e9)), M, "experiences_trained",
                        "expected int, got float 1000000000.0"),
    "experiences 10**9": (_manifest(lambda m: m.update(experiences_trained=10**9)), M, "experiences_trained",
                          "is 1000000000, but its config trains 3 experience(s) (0 to 3)"),
    "experiences -1": (_manifest(lambda m: m.update(experiences_trained=-1)), M, "experiences_trained",
                       "must be >= 0, got -1"),
    "experiences as text": (_manifest(lambda m: m.update(experiences_trained="3")), M, "experiences_trained",
                            "expected int, got str '3'"),
    "frozen base not a mapping": (_manifest(lambda m: m.update(frozen_base="x")), M, "frozen_base",
                                  "expected mapping"),
    "frozen name unknown": (_manifest(lambda m: m.update(frozen_base={"names": ["a"], "digest": "x"})), M,
                            "frozen_base.names", "names 'a', which is not a parameter"),
    "tied to nothing": (_manifest(lambda m: m.update(tied={"x": "nope"})), M, "tied", "ties 'x' to 'nope'"),
    "strategy tensor absent": (_manifest(lambda m: m["strategy"]["importance"].update(
        {"1.weight": {"__tensor__": "99"}})), M, "strategy", "names the tensor '99'"),
    "strategy state malformed": (_manifest(lambda m: m.update(strategy={"__items__": 5})), M, "strategy",
                                 "not a saved strategy state"),
    "config hash": (_manifest(lambda m: m["config"].update(seed=1)), M, "config_hash", "does not match"),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_tampered_saved_model_is_one_line_naming_the_file_and_field(received, case):
    tamper, file, field, what = TAMPERED[case]
    tamper(_final(received))
    message = _refused(received)
    where = f"{_final(received) / file}" + (f": {field}" if field else "")
    assert message.startswith(f"{where}: "), message
    assert what in message and f"({FIX})" in message, message


def test_the_untampered_copy_loads(received, finished):
    assert clbench.load_model(received).state_dict().keys() == clbench.load_model(finished).state_dict().keys()
