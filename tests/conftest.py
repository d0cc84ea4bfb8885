"""Shared fixtures; the MPI abort-on-failure hook lives in spdnn.testing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import spdnn.threads  # noqa: F401  (one thread per rank, before numpy)

pytest_plugins = ["spdnn.testing"]

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("SPDNN_SHARED_DATA", ROOT.parent / "shared" / "data"))
GRAPHCHALLENGE = SHARED_DATA / "graphchallenge"
MNIST = SHARED_DATA / "mnist"


@pytest.fixture
def graphchallenge_dir() -> Path:
    if not (GRAPHCHALLENGE / "neuron1024" / "n1024-l1.tsv").is_file():
        pytest.skip(f"Graph Challenge data not found under {GRAPHCHALLENGE} (../shared absent)")
    return GRAPHCHALLENGE
