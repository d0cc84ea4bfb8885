"""``spdnn calibrate`` end to end on 1 and 2 ranks (1 rank: no network part), on reduced
grids so that it takes seconds: the file it writes is complete and loads, and it says what it
measured. ``--quick``'s grid runs in the README test (docs/cost-model.md, 2 ranks); the full
grid is the same code over more cells (about two minutes)."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

from spdnn.cost.calibrate import CalibrationGrid

pytestmark = pytest.mark.mpi


# Seconds, not minutes: two of everything, three message sizes, a 4 MiB cache eviction (the
# default writes 1.5x the last-level cache before each cold call, most of this grid's time on a
# host with a large L3; which size evicts does not change what the file holds).
TINY = CalibrationGrid(batches=(8, 32), inputs=(256, 1024), reuses=(1, 4),
                       dense_shapes=((4, 64), (16, 256)), structured=1024,
                       structure_batches=(8, 32), reference_batches=(8, 32),
                       warm_references=(((256, 256, 256), (8, 32)),),
                       cold_references=(((1024, 1024, 1024), (8, 32)),), reference_rounds=2,
                       reference_seconds=0.02,
                       link_sizes=(8, 1024, 131072), stack_work_s=0.02, stack_rounds=3,
                       evict_bytes=4 * 2**20, cold_reps=1)


def test_calibrate_writes_a_complete_file_on_any_number_of_ranks(comm, mpi_tmp_path):
    if comm.size > 2:
        pytest.skip("one rank per core: 1 and 2 ranks cover both paths (with and without a "
                    "network part) on this 2-core machine")
    from spdnn.cost.calibrate import run_calibrate
    from spdnn.cost.machine import load_calibration

    path = mpi_tmp_path / "machine.json"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert run_calibrate(comm, str(path), ("bfloat16",), grid=TINY) == 0
    comm.barrier()
    cal = load_calibration(path)
    # float32's tables too: the reference steps that scale them run in float32
    assert cal.ranks == comm.size and set(cal.kernels) == {"float32", "bfloat16"}
    for dtype in cal.kernels:
        table = cal.table(dtype)
        assert table.batches == (8, 32) and np.all(table.ns["forward"] > 0)
        assert np.all(table.dense.ns["gradient"] > 0) and cal.structure is not None
    assert cal.runtime["round_ns_per_value"] > 0
    assert all(cal.runtime[k] > 0 for k in ("layer_forward_s", "message_s",
                                             "update_ns_per_value"))
    from spdnn.optim import OPTIMIZERS

    assert set(cal.updates) == set(OPTIMIZERS) and all(v > 0 for v in cal.updates.values())
    if comm.rank == 0:
        text = out.getvalue()
        assert f"wrote {path}: {comm.size} rank(s)" in text, text
        assert "between the 2 rounds of reference steps" in text
        if comm.size == 1:
            assert cal.network is None and "no network part" in text
        else:
            assert cal.network is not None and "ping-pong latency" in text
            assert "ns of CPU a byte at each end" in text and cal.network.cpu_ns_per_byte >= 0
            assert len(cal.network.pingpong_bytes) == 3
