"""The documents' leaderboard numbers: one reading of each committed leaderboard for all tests here
(reading verifies and rescores every entry, which is most of these tests' time)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clbench.leaderboard.doc_tables import Leaderboards

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def boards() -> Leaderboards:
    return Leaderboards(ROOT)
