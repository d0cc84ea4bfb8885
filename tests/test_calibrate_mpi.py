"""``spdnn calibrate`` end to end on 1 and 2 ranks (1 rank: no network part), on reduced
grids so that it takes seconds: the file it writes is complete and loads, and it says what it
measured. The full-size command runs in the README test (docs/cost-model.md, 2 ranks)."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

pytestmark = pytest.mark.mpi


@pytest.fixture
def small_grids(monkeypatch):
    # Internal: the grids are module constants of the calibration (no option sets them).
    from spdnn.cost import _calibrate_kernels as ck
    from spdnn.cost import _calibrate_link as cl
    from spdnn.cost import _calibrate_runtime as cr
    from spdnn.cost import calibrate as cal

    for module in (ck, cal):
        monkeypatch.setattr(module, "BATCHES", (8, 32), raising=False)
        monkeypatch.setattr(module, "INPUTS", (256, 1024), raising=False)
        monkeypatch.setattr(module, "REUSES", (1, 4), raising=False)
    monkeypatch.setattr(ck, "DENSE_SHAPES", ((4, 64), (16, 256)))
    monkeypatch.setattr(ck, "STRUCTURED", 1024)
    monkeypatch.setattr(ck, "STRUCTURE_BATCHES", (8, 32))
    for module in (cr, cal):
        monkeypatch.setattr(module, "REFERENCE_ROUNDS", 1, raising=False)
        monkeypatch.setattr(module, "REFERENCE_BATCHES", (8, 32), raising=False)
    for module in (cl, cal):
        monkeypatch.setattr(module, "SIZES", (8, 1024, 131072), raising=False)
    monkeypatch.setattr(cl, "STACK_WORK_S", 0.02)
    monkeypatch.setattr(cl, "STACK_ROUNDS", 3)
    monkeypatch.setattr(cr, "WARM_REFERENCES", (((256, 256, 256), (8, 32)),))
    monkeypatch.setattr(cr, "COLD_REFERENCES", (((1024, 1024, 1024), (8, 32)),))


def test_calibrate_writes_a_complete_file_on_any_number_of_ranks(comm, mpi_tmp_path,
                                                                  small_grids):
    if comm.size > 2:
        pytest.skip("one rank per core: 1 and 2 ranks cover both paths (with and without a "
                    "network part) on this 2-core machine")
    from spdnn.cost.calibrate import run_calibrate
    from spdnn.cost.machine import load_calibration

    path = mpi_tmp_path / "machine.json"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert run_calibrate(comm, str(path), "float32") == 0
    comm.barrier()
    cal = load_calibration(path)
    assert cal.ranks == comm.size and set(cal.kernels) == {"float32"}
    table = cal.table("float32")
    assert table.batches == (8, 32) and np.all(table.ns["forward"] > 0)
    assert np.all(table.dense.ns["gradient"] > 0) and cal.structure is not None
    assert all(cal.runtime[k] > 0 for k in ("layer_forward_s", "message_s",
                                             "update_ns_per_value"))
    if comm.rank == 0:
        text = out.getvalue()
        assert f"wrote {path}: {comm.size} rank(s)" in text, text
        assert "rounds of reference steps" in text
        if comm.size == 1:
            assert cal.network is None and "no network part" in text
        else:
            assert cal.network is not None and "ping-pong latency" in text
            assert "ns of CPU a byte at each end" in text and cal.network.cpu_ns_per_byte >= 0
            assert len(cal.network.pingpong_bytes) == 3
