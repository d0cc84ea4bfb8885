"""The distributed runtime against the serial reference, under any communicator size.

Run by the test command under mpiexec -n 1, 2, 3 and 4 (pytest-mpi, marker ``mpi``).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from partition.methods import partition_network
from spdnn.comm.mpi import AgreedError
from spdnn.io.bundle import save_network
from spdnn.io.loaders import Dataset
from spdnn.io.planfile import save_plan
from spdnn.kernels.encoding import HEADER, MODES
from spdnn.kernels.layers import LayerRun
from spdnn.model.generate import radixnet
from spdnn.model.plan import Plan, network_patterns, plan_statistics
from spdnn.optim import SGDConfig
from spdnn.reference import challenge_infer as reference_challenge
from spdnn.reference import train as reference_train
from spdnn.runtime.accounting import accounting, plan_volume
from spdnn.runtime.checkpoint import load_checkpoint
from spdnn.runtime.inference import challenge_infer
from spdnn.runtime.session import gather_network, open_network
from spdnn.runtime.training import TrainConfig, train
from tests.helpers import small_network

pytestmark = pytest.mark.mpi


def _data(net, n=50, seed=4):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, net.sizes[0]))
    y = rng.integers(0, net.sizes[-1], n)
    xt = rng.standard_normal((13, net.sizes[0]))
    yt = rng.integers(0, net.sizes[-1], 13)
    return Dataset(name="synthetic", x_train=x, y_train=y, x_test=xt, y_test=yt)


def _setup(tmp, net, method, comm, name="net", dtype=None, exchange="auto"):
    """Rank 0 writes the bundle and a plan for this communicator (``method``, or a Plan);
    every rank opens them (rows travel as ``exchange`` says)."""
    label = method if isinstance(method, str) else "custom"
    path, plan_path = tmp / f"{name}.npz", tmp / f"{name}-{label}-{comm.size}.npz"
    if comm.rank == 0:
        save_network(net, path)
        plan = method if isinstance(method, Plan) else \
            partition_network(network_patterns(net), comm.size, method=method, seed=3,
                              fingerprint=net.fingerprint())
        save_plan(plan, plan_path)
    comm.barrier()
    return open_network(comm, str(path), str(plan_path), dtype, exchange=exchange)


def _assert_equal_networks(a, b, tol):
    for la, lb in zip(a.layers, b.layers):
        np.testing.assert_array_equal(la.weight.indptr, lb.weight.indptr)
        np.testing.assert_array_equal(la.weight.indices, lb.weight.indices)
        np.testing.assert_allclose(la.weight.data, lb.weight.data, rtol=0, atol=tol)
        np.testing.assert_allclose(la.bias, lb.bias, rtol=0, atol=tol)


def _train_and_compare(comm, tmp, net, method, tol, dtype="float64", steps=8, exchange="auto"):
    data = _data(net)
    sgd = SGDConfig(lr=0.05, momentum=0.9, weight_decay=0.01)
    run = _setup(tmp, net, method, comm, dtype=dtype, exchange=exchange)
    cfg = TrainConfig(epochs=2, batch_size=16, optimizer=sgd, seed=7)
    reports = train(comm, run.dnet, data, cfg)
    expected, ref_reports = reference_train(net.astype(dtype), data, 2, 16, sgd, seed=7)
    assert reports[-1].steps == steps  # 4 steps per epoch, the last batch smaller
    np.testing.assert_allclose([r.loss for r in reports], [r.loss for r in ref_reports],
                               rtol=tol)
    got = gather_network(run.dnet)
    if got is not None:  # rank 0 of every replica
        _assert_equal_networks(got, expected, tol)
    return reports, ref_reports


@pytest.mark.parametrize("method", ["block", "random", "hypergraph", "sweep"])
@pytest.mark.parametrize("cap, out", [(None, "linear"), (2.0, "relu")])
def test_sgd_equals_the_serial_reference(comm, mpi_tmp_path, backend, method, cap, out):
    net = small_network((20, 24, 18, 6), fan_in=5, seed=1, cap=cap, output_activation=out,
                        bias_scale=0.3)
    reports, ref = _train_and_compare(comm, mpi_tmp_path, net, method, 1e-10)
    assert [r.test_accuracy for r in reports] == [r.test_accuracy for r in ref]


def test_mse_loss_equals_the_serial_reference(comm, mpi_tmp_path):
    net = small_network((20, 24, 18, 6), fan_in=5, seed=2, cap=2.0, output_activation="relu")
    data = _data(net)
    run = _setup(mpi_tmp_path, net, "hypergraph", comm)
    cfg = TrainConfig(epochs=2, batch_size=16, optimizer=SGDConfig(0.05, 0.9), seed=7, loss="mse")
    train(comm, run.dnet, data, cfg)
    expected, _ = reference_train(net, data, 2, 16, SGDConfig(0.05, 0.9), seed=7, loss="mse")
    got = gather_network(run.dnet)
    if got is not None:  # rank 0 of every replica
        _assert_equal_networks(got, expected, 1e-10)


def test_float32_equals_the_reference_within_float32_rounding(comm, mpi_tmp_path, backend):
    """float32 (the CLI default): the distributed sums run in another order than scipy's, so
    results agree to float32 rounding: 8 steps of a 3-layer network stay within 2e-6 (about
    16 units of float32 epsilon at the weights' scale of ~1)."""
    net = small_network((20, 24, 18, 6), fan_in=5, seed=1, bias_scale=0.3)
    _train_and_compare(comm, mpi_tmp_path, net, "hypergraph", 2e-6, dtype="float32")


def test_a_rank_that_owns_no_row_of_a_layer(comm, mpi_tmp_path):
    net = small_network((20, 24, 18, 6), fan_in=5, seed=3, bias_scale=0.3)
    owners = [np.arange(n, dtype=np.int32) % comm.size for n in net.sizes]
    owners[2][:] = 0  # every other rank owns nothing of layer 2
    owners[0][:] = comm.size - 1  # and of the inputs only the last rank owns anything
    plan = Plan(comm.size, tuple(owners), {"method": "custom", "fingerprint":
                                           net.fingerprint()})
    _train_and_compare(comm, mpi_tmp_path, net, plan, 1e-10)


def test_a_rank_that_owns_nothing_at_all_is_a_valid_rank(comm, mpi_tmp_path):
    """Every neuron on rank 0: the others own no row of any layer, and the job (training and
    its evaluations) still equals the serial run (it ended in a ZeroDivisionError there)."""
    net = small_network((20, 24, 18, 6), fan_in=5, seed=6, bias_scale=0.3)
    plan = Plan(comm.size, tuple(np.zeros(n, np.int32) for n in net.sizes),
                {"method": "custom", "fingerprint": net.fingerprint()})
    _train_and_compare(comm, mpi_tmp_path, net, plan, 1e-10)


@pytest.mark.parametrize("method", ["cyclic", "hypergraph", "sweep"])
def test_counted_traffic_equals_the_plan_volume(comm, mpi_tmp_path, method):
    net = small_network((30, 40, 40, 8), fan_in=6, seed=2)
    run = _setup(mpi_tmp_path, net, method, comm)
    train(comm, run.dnet, _data(net, n=37), TrainConfig(epochs=1, batch_size=10,
                                                        optimizer=SGDConfig(0.01)))
    dnet = run.dnet
    volume = plan_volume(comm, run.plan, [lay.exchange.n_ghost for lay in dnet.layers])
    acc = accounting(comm, dnet.traffic, volume, dnet.dtype.itemsize).as_dict()
    assert acc["equal"] and {k: acc["counted"][k] for k in acc["predicted"]} == \
        acc["predicted"], acc
    # Bytes sent (auto: the smaller encoding per message) never exceed the dense rows plus a
    # header per message.
    for direction in ("forward", "backward"):
        for sent, dense, passes in zip(acc["counted"][f"{direction}_sent"],
                                       acc["counted"][f"{direction}_bytes"],
                                       dnet.traffic.total(comm).__dict__[f"{direction}_passes"]):
            assert sent <= dense + HEADER * passes * comm.size * (comm.size - 1)
    # Independently of the runtime and the plan file: the volume from the whole patterns.
    stats = plan_statistics(network_patterns(net), run.plan.owners, parts=comm.size)
    item = np.dtype(np.float64).itemsize
    # 4 training batches (10, 10, 10, 7) and one evaluation batch of 13 test samples.
    assert acc["counted"]["forward_bytes"] == [v * (37 + 13) * item for v in stats.forward]
    assert acc["counted"]["backward_rows"] == [v * 4 for v in stats.backward]
    assert acc["counted"]["backward_bytes"][0] == 0
    if comm.size > 1:
        assert sum(stats.forward) > 0
    # The schedules alone predict the same volume (the fallback for plans without stats).
    bare = Plan(run.plan.parts, run.plan.owners, {})
    assert [v.tolist() for v in plan_volume(comm, bare, [lay.exchange.n_ghost for lay in
                                                        dnet.layers])[:2]] == \
        [list(stats.forward), list(stats.backward)]


@pytest.mark.parametrize("window_layers", [1, 2])
def test_a_plan_built_in_windows_of_layers_trains_to_the_serial_reference(comm, mpi_tmp_path,
                                                                         window_layers):
    """partition/windows.py: the plan of a network partitioned a window of layers at a time
    (the hypergraph method on each, inputs fixed to the window before) is a plan like any:
    training equals the serial reference, and the rows counted moving equal its statistics."""
    from partition.windows import PatternList, choose_windows, partition_windows

    net = small_network((20, 24, 18, 16, 6), fan_in=5, seed=4, cap=2.0, bias_scale=0.3)
    source = PatternList(network_patterns(net))
    windows = choose_windows(source, comm.size, limit=2**40, max_layers=window_layers)
    assert [(w.first, w.last) for w in windows] == \
        {1: [(1, 1), (2, 2), (3, 3), (4, 4)], 2: [(1, 2), (2, 3), (3, 4)]}[window_layers]
    done = partition_windows(source, comm.size, windows, seed=3, fingerprint=net.fingerprint())
    assert done.stats == plan_statistics(network_patterns(net), done.plan.owners, parts=comm.size)
    _train_and_compare(comm, mpi_tmp_path, net, done.plan, 1e-10)
    run = _setup(mpi_tmp_path, net, done.plan, comm, name="windowed")
    train(comm, run.dnet, _data(net, n=20), TrainConfig(epochs=1, batch_size=10,
                                                        optimizer=SGDConfig(0.01)))
    volume = plan_volume(comm, run.plan, [lay.exchange.n_ghost for lay in run.dnet.layers])
    acc = accounting(comm, run.dnet.traffic, volume, run.dnet.dtype.itemsize).as_dict()
    assert acc["counted"]["backward_rows"] == [v * 2 for v in done.stats.backward]


def test_interrupted_and_resumed_equals_uninterrupted(comm, mpi_tmp_path):
    net = small_network((20, 24, 18, 6), fan_in=5, seed=5)
    data = _data(net)
    sgd = SGDConfig(lr=0.05, momentum=0.9, weight_decay=0.001)
    full_cfg = TrainConfig(epochs=3, batch_size=16, optimizer=sgd, seed=1)
    whole = _setup(mpi_tmp_path, net, "hypergraph", comm, "a").dnet
    train(comm, whole, data, full_cfg)
    expected = gather_network(whole)

    # The first part runs on a smaller communicator (another P) when there is more than one
    # rank, stopping mid-epoch; the resumed part runs on every rank with another plan.
    ckpt = str(mpi_tmp_path / "ckpt")
    first_size = max(1, comm.size - 1)
    with comm.split(0 if comm.rank < first_size else 1) as sub:
        if comm.rank < first_size:
            part = _setup(mpi_tmp_path, net, "block", sub, "b").dnet
            cfg = TrainConfig(epochs=3, batch_size=16, optimizer=sgd, seed=1, max_steps=6,
                              checkpoint_dir=ckpt,
                              checkpoint_every=2)
            train(sub, part, data, cfg)
    comm.barrier()
    resumed = _setup(mpi_tmp_path, net, "random", comm, "c").dnet
    with pytest.raises(AgreedError, match="batch_size 16, this run has 8"):
        comm.check(lambda: load_checkpoint(resumed, ckpt, {"batch_size": 8, "seed": 1,
                                                           "shuffle": True}))
    # Explicitly allowed, a smaller batch resumes at the batch holding the first unseen sample:
    # batch 2 of 16 samples is batch 4 of 8.
    changed, _ = load_checkpoint(resumed, ckpt, {"batch_size": 8, "seed": 1, "shuffle": True},
                                 allow_changes=True)
    assert (changed.step, changed.epoch, changed.batch) == (6, 1, 4)
    position, momentum = load_checkpoint(resumed, ckpt, full_cfg.settings())
    assert (position.step, position.epoch, position.batch) == (6, 1, 2)
    train(comm, resumed, data, full_cfg, position, momentum)
    got = gather_network(resumed)
    if got is not None:  # rank 0 of every replica
        _assert_equal_networks(got, expected, 1e-10)


def test_bad_inputs_fail_on_every_rank(comm, mpi_tmp_path):
    net = small_network()
    _setup(mpi_tmp_path, net, "cyclic", comm)
    other = small_network(seed=9)
    if comm.rank == 0:
        save_network(other, mpi_tmp_path / "other.npz")
        wrong_p = partition_network(network_patterns(net), comm.size + 1, method="cyclic",
                                    fingerprint=net.fingerprint())
        save_plan(wrong_p, mpi_tmp_path / "wrong-p.npz")
    comm.barrier()
    plan = str(mpi_tmp_path / f"net-cyclic-{comm.size}.npz")
    with pytest.raises(AgreedError, match="plan was made for network"):
        open_network(comm, str(mpi_tmp_path / "other.npz"), plan)
    with pytest.raises(AgreedError, match=f"plan is for P={comm.size + 1} ranks"):
        open_network(comm, str(mpi_tmp_path / "net.npz"), str(mpi_tmp_path / "wrong-p.npz"))
    dnet = open_network(comm, str(mpi_tmp_path / "net.npz"), plan).dnet
    with pytest.raises(AgreedError, match="no checkpoint manifest"):
        comm.check(lambda: load_checkpoint(dnet, str(mpi_tmp_path / "none"), {}))
    bad = Dataset(name="bad", x_train=np.zeros((4, 5)), y_train=np.zeros(4, dtype=np.int64))
    with pytest.raises(AgreedError, match="5 features"):
        comm.check(lambda: train(comm, dnet, bad, TrainConfig(epochs=1, batch_size=2,
                                                              optimizer=SGDConfig())))


def _images(n, seed=5):
    """Binary images of 150-400 active features each: on a 12-layer RadiX-Net some die in
    the first layers, some survive to the end."""
    rng = np.random.default_rng(seed)
    rows, cols = [], []
    for i in range(n):
        k = int(rng.integers(150, 400))
        rows += [i] * k
        cols += list(rng.choice(1024, k, replace=False))
    return sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, 1024))


@pytest.mark.parametrize(("method", "chunk"), [("block", None), ("cyclic", None),
                                               ("cyclic", 7), ("random", "small")])
def test_graph_challenge_mode_equals_the_reference_on_a_synthetic_network(
        comm, mpi_tmp_path, method, chunk, monkeypatch):
    net = radixnet(1024, 12, seed=0, dtype="float64")
    images = _images(120)
    expected = reference_challenge(net, images)
    assert 0 < len(expected.categories) < 120  # some samples die, some survive
    run = _setup(mpi_tmp_path, net, method, comm, "rx")
    if chunk == "small":  # ranks whose blocks suggest different chunks must agree on one
        import spdnn.runtime.inference as inference

        monkeypatch.setattr(inference, "CHALLENGE_MIN_CHUNK", 1)
        monkeypatch.setattr(inference, "CHALLENGE_BLOCK_BYTES", (1 << 16) * (1 + comm.rank))
        chunk = None
    got = challenge_infer(comm, run.dnet, images, run.nnz, chunk=chunk)  # 7: 18 chunks
    np.testing.assert_array_equal(got.categories, expected.categories)
    assert got.edges == net.nnz == 12 * 1024 * 32
    assert got.rate == pytest.approx(120 * net.nnz / got.seconds)


def test_chunks_whose_samples_all_die_end_early_and_agree_with_the_reference(comm,
                                                                            mpi_tmp_path):
    """Chunks of 5: the first two of sparse images that die within the first layers (their
    remaining layers are skipped on every rank alike), the third mixed."""
    net = radixnet(1024, 12, seed=0, dtype="float64")
    images = _images(60)
    ref = reference_challenge(net, images).categories - 1
    dying = np.setdiff1d(np.arange(60), ref)
    faint = sp.csr_matrix(images[dying[:10]].multiply(0.01))  # weak inputs: dead by layer 2
    mixed = sp.vstack([faint, images[np.concatenate([dying[10:13], ref[:2]])]]).tocsr()
    expected = reference_challenge(net, mixed).categories
    assert len(expected) and expected.min() > 10  # the first two chunks die, some of the rest live
    run = _setup(mpi_tmp_path, net, "cyclic", comm, "rx")
    got = challenge_infer(comm, run.dnet, mixed, run.nnz, chunk=5)
    np.testing.assert_array_equal(got.categories, expected)
    before = run.dnet.timers.compute[0].copy()  # a layer that runs adds compute time
    none = challenge_infer(comm, run.dnet, faint, run.nnz, chunk=5)
    assert len(none.categories) == 0
    layers_run = np.flatnonzero(run.dnet.timers.compute[0] > before)
    assert 0 < len(layers_run) <= 2  # both chunks over by layer 2 of 12 (at P = 1 in one
    # kernel call a chunk: spdnn.runtime.narrow_tail)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_the_narrow_end_in_one_call_equals_the_layer_by_layer_pass(comm, mpi_tmp_path, dtype):
    """Where a rank holds every row (P = 1 here), the layers after the batch turns narrow run
    in one kernel call (spdnn.runtime.narrow_tail): Z of the last layer and the surviving samples
    are those of the pass that runs them one at a time, bit for bit, at every width (bfloat16:
    16-bit weights and outputs, float32 biases and Z)."""
    values = "float32" if dtype == "bfloat16" else dtype
    net = radixnet(1024, 12, seed=0, dtype=values)
    run = _setup(mpi_tmp_path, net, "cyclic", comm, "rx", dtype=dtype)
    x = _images(40).T.toarray().astype(values)
    mine = np.ascontiguousarray(x[run.dnet.input_rows])
    results = []
    for fused in (True, False):
        run.dnet.layer_run = False if fused else None  # built again, or never
        for width in (3, 9, 25, 40):
            fwd = run.dnet.forward(mine[:, :width], keep=False, drop_dead=True)
            results.append((fwd.z_last.copy(), fwd.ids.copy()))
        assert isinstance(run.dnet.layer_run, LayerRun) == (fused and comm.size == 1)
    for (z, ids), (z_ref, ids_ref) in zip(results[:4], results[4:]):
        np.testing.assert_array_equal(ids, ids_ref)
        np.testing.assert_array_equal(z, z_ref)
    assert {len(ids) for _, ids in results} != {0}


@pytest.mark.parametrize("exchange", MODES)
def test_graph_challenge_subset_categories(comm, mpi_tmp_path, graphchallenge_dir, neuron1024,
                                          exchange):
    from spdnn.io.formats import read_categories, read_inputs

    path = mpi_tmp_path / "gc.npz"
    if comm.rank == 0:
        net = neuron1024()
        save_network(net, path)
        plan = partition_network(network_patterns(net), comm.size, method="cyclic",
                                 fingerprint=net.fingerprint())
        save_plan(plan, mpi_tmp_path / "gc-plan.npz")
    comm.barrier()
    run = open_network(comm, str(path), str(mpi_tmp_path / "gc-plan.npz"), exchange=exchange)
    images = read_inputs(graphchallenge_dir / "sparse-images-1024_subset.mtx", 1024)
    truth = read_categories(graphchallenge_dir / "neuron1024-l120-categories_subset.mtx")
    result = challenge_infer(comm, run.dnet, images, run.nnz)
    np.testing.assert_array_equal(result.categories, truth)
    assert result.edges == 120 * 1024 * 32
    assert result.rate == pytest.approx(1200 * result.edges / result.seconds)
