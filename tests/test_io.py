"""Atomic writes: the old file or the new one, never half of one, with ordinary permissions."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch

from clbench.io import atomic_write, remove_stale_temporaries, torch_save, write_json


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_writer_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "result.json"
    write_json(path, {"run": 1})

    def half_then_fail(handle):
        handle.write('{"run": 2, "r_matr')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, half_then_fail)
    assert json.loads(path.read_text()) == {"run": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_new_files_get_the_umask_mode_and_replaced_files_keep_theirs(tmp_path):
    old = os.umask(0o027)
    try:
        write_json(tmp_path / "a.json", {})
        assert _mode(tmp_path / "a.json") == 0o640
    finally:
        os.umask(old)
    (tmp_path / "a.json").chmod(0o604)
    write_json(tmp_path / "a.json", {"again": True})
    assert _mode(tmp_path / "a.json") == 0o604


def test_stale_temporaries_of_one_name_are_removed(tmp_path):
    for name in (".checkpoint.pt.abc.tmp", ".result.json.x1.tmp", "checkpoint.pt", ".notes.tmp"):
        (tmp_path / name).write_text("")
    remove_stale_temporaries(tmp_path, "checkpoint.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".notes.tmp", ".result.json.x1.tmp", "checkpoint.pt"]


def test_torch_save_loads_weights_only(tmp_path):
    torch_save(tmp_path / "c.pt", {"w": torch.arange(3), "meta": {"stage": 2, "names": ["a"]}})
    loaded = torch.load(tmp_path / "c.pt", weights_only=True)
    assert loaded["meta"] == {"stage": 2, "names": ["a"]} and loaded["w"].tolist() == [0, 1, 2]
