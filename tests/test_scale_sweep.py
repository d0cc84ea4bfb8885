"""scripts/bench/scale_sweep.py at P <= 2 (all this machine has): every grid measured and predicted,
written in the validation format; and the same over 2 emulated nodes."""

from __future__ import annotations

import json

import pytest

from spdnn.io.bundle import save_network
from tests.helpers import ROOT, emulation_refused, launch, small_network

CALIBRATION = ROOT / "docs" / "calibration-2core-vm.json"
GRIDS = {"1x1", "1x2", "2x1 hypergraph", "2x1 block"}


def _sweep(tmp_path, *extra: object) -> dict:
    net = tmp_path / "net.npz"
    save_network(small_network(sizes=(64, 96, 96, 10), fan_in=8, dtype="float32"), net)
    out = tmp_path / "sweep.json"
    sweep = ROOT / "scripts" / "bench" / "scale_sweep.py"
    proc = launch(0, sweep, "--network", net, "--max-ranks", 2,
                  "--batch", 16, "--steps", 2, "--rounds", 1, "--calibration", CALIBRATION,
                  "-o", out, *extra, module=None, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["format"] == "spdnn-validation/1" and len(data["calibrations"]) == 1
    cases = {eval(case)[2][0] for case in data["steps"]}  # noqa: S307 - our own repr
    assert cases == GRIDS, cases
    for case, times in data["steps"].items():
        assert len(times) == 1 and times[0] > 0, case
        assert data["predicted"][case][0] > 0, case
    assert "predicted / measured" in proc.stdout
    return data


@pytest.mark.long
def test_every_grid_up_to_two_ranks_is_measured_and_predicted(tmp_path):
    """Over 2 emulated nodes where namespaces are permitted (the 1-rank grids run alone, the
    2-rank ones on the nodes: both ways of starting a job), else on this node."""
    if emulation_refused() is None:
        emulated = {"nodes": 2, "link": "1gbit"}
        assert _sweep(tmp_path, "--nodes", 2, "--link", "1gbit")["emulated"] == emulated
    else:
        assert _sweep(tmp_path)["emulated"] is None
