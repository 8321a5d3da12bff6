"""A config's hash names its committed leaderboard entries, so no change to how a config is read
and checked may change it: every committed leaderboard's suite still expands to the hashes its
``suite.json`` lists, committed entries' configs resolve to themselves and their hash, and the
experiment configs keep the hashes they had when the config file's checks became pydantic
models (an edit of one of those files changes its hash on purpose: update it here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clbench.config.load import config_hash, load_config, resolve_config
from clbench.leaderboard.suite import load_suite

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "leaderboards").glob("*/suite.json"))
EXPERIMENTS = {
    "cifar10_dirichlet_vit.yaml": "e970b8e140a13c10fbd5e1fa94919eaafb5fe8128dea4409dbca82ad23a7e120",
    "core50_domains11_vit.yaml": "01ee509df01fa7120a448bf799b2d82bcd1450ccff89b20a19e3aff81e3767c0",
    "office_home_vit.yaml": "0900ad578c0b1830d1b3437be1ee8e220ba8535efa408693bad1ad68f6d8bfe3",
    "thesis_cifar10_dirichlet_moe.yaml": "8de45d691d849ee4bb0c03ddbe129f8c9eff1c3b873b8145f7cb1a6ceb35b706",
    "thesis_core50_moe.yaml": "3a49641df8322a9d6f737ee3b8521849d1f004a3ba473beb1dfd3604888558bc",
    "thesis_office_home_moe.yaml": "572722816d96bbee85790e489938b6bbdbb6e717d6ffa44fcb4a464091cfcf30",
    "trace_qwen3_0.6b.yaml": "77a9b3d2d0ea4f978228758a19dad7c840fcb6a30697e082f6fc6cf1537cabbd",
    "trace_qwen3_0.6b_loramoe.yaml": "f437fe534d24c42c6793caa335fa6150a7e6df785c371f11a5c8d8b93a3c01a1",
    "trace_qwen3_0.6b_mh_moe.yaml": "4d9364f764a4dcf8a9934dc4f734841682079216b9fbfe6f2fa8684e009ac6ed",
    "trace_qwen3_0.6b_moses.yaml": "7d72f2b0f42a9a9ec4428b4189b09b96176bbf1ea426c0580042354a6cbf7f36",
}


def test_every_experiment_config_is_listed():
    assert {p.name for p in (ROOT / "configs" / "experiments").glob("*.yaml")} == set(EXPERIMENTS)


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_experiment_configs_keep_their_hashes(name):
    assert config_hash(load_config(ROOT / "configs" / "experiments" / name)) == EXPERIMENTS[name]


@pytest.mark.parametrize("manifest", MANIFESTS, ids=[p.parent.name for p in MANIFESTS])
def test_committed_suites_expand_to_their_committed_hashes(manifest, monkeypatch):
    monkeypatch.chdir(ROOT)  # a manifest names its suite relative to the repository
    recorded = json.loads(manifest.read_text())
    assert [run.hash for run in load_suite(recorded["source"]).runs] == [run["hash"] for run in recorded["runs"]]


@pytest.mark.parametrize("manifest", MANIFESTS, ids=[p.parent.name for p in MANIFESTS])
def test_committed_entries_configs_resolve_to_themselves(manifest):
    """The first two entries of each leaderboard (a few, to stay fast: entries can be large)."""
    for path in sorted((manifest.parent / "entries").glob("*.json"))[:2]:
        entry = json.loads(path.read_text())
        resolved = resolve_config(entry["config"], source=str(path))
        assert resolved == entry["config"]
        assert config_hash(resolved) == entry["config_hash"] == path.stem
