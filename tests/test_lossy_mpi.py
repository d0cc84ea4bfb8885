"""Lossy training on every grid: compressed gradient sums keep replicas bit-identical and resume
exactly; the critical set is the same on every grid. Run under mpiexec -n 1, 2, 3 and 4."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from spdnn.comm.mpi import Communicator
from spdnn.lossy.compress import parse_compress
from spdnn.runtime.checkpoint import load_checkpoint
from spdnn.runtime.session import gather_network
from spdnn.runtime.training import TrainConfig, resumed_lossy, train
from tests.helpers import small_network
from tests.test_replicas_mpi import SGD, _assert_close, _data, _digest, _open, grids

pytestmark = pytest.mark.mpi


def _replicated(size: int) -> list[tuple[int, int]]:
    return [g for g in grids(size) if g[1] > 1]


@pytest.mark.parametrize("kind", ["topk:0.05", "dgc:0.05", "sidco:0.05", "sidco:0.02:gpareto"])
def test_compressed_sums_keep_replicas_identical(comm, mpi_tmp_path, kind):
    net = small_network((20, 40, 30, 6), fan_in=8, seed=3, bias_scale=0.3)
    data = _data(net)
    exact = TrainConfig(epochs=2, batch_size=16, optimizer=SGD, seed=2)
    cfg = replace(exact, compress=parse_compress(kind))
    if comm.size == 1:  # one replica: nothing is summed, compression changes nothing
        a = _open(comm, mpi_tmp_path, net, 1, 1, "block").dnet
        b = _open(comm, mpi_tmp_path, net, 1, 1, "block").dnet
        train(comm, a, data, exact)
        reports = train(comm, b, data, cfg)
        assert _digest(a) == _digest(b) and reports[-1].compression_ratio is None
        return
    for parts, replicas in _replicated(comm.size):
        dense = _open(comm, mpi_tmp_path, net, parts, replicas).dnet
        exact_reports = train(comm, dense, data, exact)
        run = _open(comm, mpi_tmp_path, net, parts, replicas).dnet
        reports = train(comm, run, data, cfg)
        digests = run.grid.data.allgather(_digest(run))
        assert len(set(digests)) == 1, (parts, replicas, kind)
        assert _digest(run) != _digest(dense)  # it is lossy
        r = reports[-1]
        assert 0.5 * cfg.compress.ratio <= r.compression_ratio <= 2.5 * cfg.compress.ratio
        # positions and values of the selected entries, against every value
        assert r.gradient_values < 6 * cfg.compress.ratio * exact_reports[-1].gradient_values
        assert r.loss < reports[0].loss + 0.5  # it still trains
        run.grid.free()
        dense.grid.free()


def test_hylo_sums_keep_replicas_identical_in_a_sixteenth_of_the_bytes(comm, mpi_tmp_path):
    net = small_network((20, 40, 30, 6), fan_in=8, seed=3, bias_scale=0.3)
    data = _data(net)
    exact = TrainConfig(epochs=2, batch_size=16, optimizer=SGD, seed=2)
    cfg = replace(exact, compress=parse_compress("hylo"))
    for parts, replicas in _replicated(comm.size):
        dense = _open(comm, mpi_tmp_path, net, parts, replicas).dnet
        exact_reports = train(comm, dense, data, exact)
        # every layer below --compress-min-values: summed exactly, bit for bit
        small = _open(comm, mpi_tmp_path, net, parts, replicas).dnet
        train(comm, small, data, replace(exact, compress=parse_compress("hylo", 10**6)))
        assert small.sums.compressors == [None] * 3 and _digest(small) == _digest(dense)
        run = _open(comm, mpi_tmp_path, net, parts, replicas).dnet
        reports = train(comm, run, data, cfg)
        assert len(set(run.grid.data.allgather(_digest(run)))) == 1, (parts, replicas)
        assert _digest(run) != _digest(dense)  # it is lossy
        r, e = reports[-1], exact_reports[-1]
        assert 0.05 < r.compression_ratio < 0.9  # the share of nonzero codes
        assert r.gradient_megabytes * 14 < e.gradient_megabytes
        assert r.loss < reports[0].loss + 0.5  # it still trains
        for d in (run, small, dense):
            d.grid.free()


@pytest.mark.parametrize("kind", ["dgc:0.1", "sidco:0.05", "hylo"])
def test_resume_with_compression_and_critical_set_equals_the_uninterrupted_run(
        comm, mpi_tmp_path, kind):
    net = small_network((20, 40, 30, 6), fan_in=8, seed=4, bias_scale=0.3)
    data = _data(net)
    grid = _replicated(comm.size)[0] if comm.size > 1 else (1, 1)
    full = TrainConfig(epochs=4, batch_size=16, optimizer=SGD, seed=5,
                       compress=parse_compress(kind), critical_set=0.5, refresh=2)
    whole = _open(comm, mpi_tmp_path, net, *grid).dnet
    expected = train(comm, whole, data, full)
    assert [r.samples for r in expected] == [49, 25, 49, 25]
    ckpt = str(mpi_tmp_path / f"ckpt-{kind}")
    first = _open(comm, mpi_tmp_path, net, *grid).dnet
    # step 5 lies inside epoch 2, the first on the critical set
    train(comm, first, data, replace(full, max_steps=5, checkpoint_dir=ckpt,
                                     checkpoint_every=5))
    resumed = _open(comm, mpi_tmp_path, net, *grid).dnet
    position, momentum = load_checkpoint(resumed, ckpt, full.settings())
    assert (position.step, position.epoch, position.batch) == (5, 1, 1)
    lossy = resumed_lossy(resumed, ckpt, full, len(data.y_train))
    reports = train(comm, resumed, data, full, position, momentum, lossy)
    assert reports[-1].loss == expected[-1].loss
    assert _digest(resumed) == _digest(whole)
    for d in (whole, first, resumed):
        d.grid.free()


def test_critical_set_is_the_same_on_every_grid(comm, mpi_tmp_path):
    """Critical-set training on every grid equals the same training on one process (which
    needs the same samples in every epoch), to float64 rounding."""
    net = small_network((20, 24, 18, 6), fan_in=5, seed=6, bias_scale=0.3)
    data = _data(net, n=61)
    cfg = TrainConfig(epochs=5, batch_size=8, optimizer=SGD, seed=3, critical_set=0.3, refresh=3)
    with Communicator.self_only() as alone:
        one = _open(alone, mpi_tmp_path, net, 1, 1, name=f"alone{comm.rank}").dnet
        one_reports = train(alone, one, data, cfg)
        expected = gather_network(one)
    assert [r.samples for r in one_reports] == [61, 19, 19, 61, 19]
    for parts, replicas in grids(comm.size):
        run = _open(comm, mpi_tmp_path, net, parts, replicas).dnet
        reports = train(comm, run, data, cfg)
        assert [r.samples for r in reports] == [61, 19, 19, 61, 19]
        np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in one_reports],
                                   rtol=1e-12)
        got = gather_network(run)
        if got is not None:  # rank 0 of every replica
            _assert_close(got, expected)
        run.grid.free()


def test_resume_refuses_other_lossy_settings_and_damaged_state(comm, mpi_tmp_path):
    """Another compressor, replica count or critical set is refused (one agreed error) unless
    changes are allowed; damaged residual or critical-set files are named in the error."""
    import json
    from pathlib import Path

    from spdnn.comm.mpi import AgreedError
    from spdnn.lossy.critical import CriticalSet
    from spdnn.lossy.state import load_lossy

    net = small_network((20, 40, 30, 6), fan_in=8, seed=7, bias_scale=0.3)
    data = _data(net)
    grid = _replicated(comm.size)[0] if comm.size > 1 else (1, 1)
    cfg = TrainConfig(epochs=2, batch_size=16, optimizer=SGD, seed=5, compress=parse_compress(
        "topk:0.1"), critical_set=0.5, refresh=2, checkpoint_dir=str(mpi_tmp_path / "ck"))
    dnet = _open(comm, mpi_tmp_path, net, *grid).dnet
    train(comm, dnet, data, replace(cfg, max_steps=5))
    ck = cfg.checkpoint_dir
    n = len(data.y_train)

    def load(spec="topk:0.1", fraction=0.5, refresh=2, allow=False):
        return comm.check(lambda: load_lossy(dnet, ck, parse_compress(spec),
                                             CriticalSet(n, fraction, refresh), allow))

    assert load().pending is not None
    with pytest.raises(AgreedError, match="--compress"):
        load("dgc:0.1")
    with pytest.raises(AgreedError, match="--critical-set"):
        load(fraction=0.25)
    fresh = load("dgc:0.1", 0.25, allow=True)
    assert fresh.pending is None and all(r is None for r in fresh.residuals)
    manifest = json.loads((Path(ck) / "manifest.json").read_text())
    comm.barrier()
    if comm.rank == 0:  # a critical-set file with the wrong number of samples
        np.savez(Path(ck) / manifest["critical"], pending=np.zeros(n + 1))
    comm.barrier()
    with pytest.raises(AgreedError, match="one per training sample"):
        load()
    if grid[1] > 1:
        comm.barrier()
        if comm.rank == 0:  # a residual of the wrong length
            bad = Path(ck) / manifest["residual_files"][0][0]
            with np.load(bad) as z:
                arrays = dict(z)
            arrays["rw1"] = arrays["rw1"][:-1]
            np.savez(bad, **arrays)
        comm.barrier()
        with pytest.raises(AgreedError, match="rw1"):
            load()
    dnet.grid.free()
