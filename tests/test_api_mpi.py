"""The Python API (``spdnn.train``, ``spdnn.infer``, ``partition.partition``) under any
communicator size, against the serial reference; objects in memory that differ between ranks
are refused on every rank."""

from __future__ import annotations

import numpy as np
import pytest

import spdnn
from partition import partition
from spdnn.comm.mpi import AgreedError
from spdnn.io.loaders import load_dataset
from spdnn.optim import SGDConfig
from spdnn.reference import accuracy
from spdnn.reference import train as reference_train
from tests.helpers import small_network

pytestmark = pytest.mark.mpi


def test_train_and_infer_from_memory_equal_the_serial_reference(comm, mpi_tmp_path):
    net = small_network((64, 24, 18, 10), fan_in=6, seed=3)
    plan = partition(net, parts=comm.size, method="cyclic")
    options = spdnn.TrainOptions(epochs=2, batch_size=32, lr=0.05, momentum=0.9, seed=5,
                                 max_steps=30)
    run = spdnn.RunOptions(plan=plan, dtype="float64")
    saved = mpi_tmp_path / "trained.npz"
    result = spdnn.train(net, data="digits", run=run, options=options, save=saved, comm=comm)
    assert (result.rank, result.ranks, result.parts) == (comm.rank, comm.size, comm.size)
    data = load_dataset("digits", "float64")
    expected, reports = reference_train(net, data, 2, 32, SGDConfig(0.05, 0.9), seed=5,
                                        max_steps=30)
    got = spdnn.load_network(saved)
    for a, b in zip(got.layers, expected.layers):
        np.testing.assert_allclose(a.weight.toarray(), b.weight.toarray(), rtol=0, atol=1e-10)
        np.testing.assert_allclose(a.bias, b.bias, rtol=0, atol=1e-10)
    assert [r.loss for r in result.epochs] == pytest.approx([r.loss for r in reports],
                                                            rel=1e-10)
    test = spdnn.infer(saved, inputs="digits", run=run, comm=comm)
    assert test.accuracy == pytest.approx(accuracy(expected, data.x_test, data.y_test))
    assert result.accuracy == reports[-1].test_accuracy  # one name for both results
    # Traffic and timing are typed records; the metrics file holds them as dicts.
    assert isinstance(result.traffic, spdnn.TrafficReport) and result.traffic.equal
    assert result.traffic.counted.forward_rows == result.traffic.predicted.forward_rows
    assert len(result.traffic.counted.forward_rows) == len(net.layers)
    assert isinstance(result.timing, spdnn.TimingReport)
    assert len(result.timing.compute.backward) == len(net.layers)
    assert all(t >= 0 for t in result.timing.wait.forward)
    assert result.metrics()["traffic"]["counted"]["forward_rows"] == list(
        result.traffic.counted.forward_rows)
    assert isinstance(test.traffic, spdnn.TrafficReport) and test.traffic.equal


def test_objects_that_differ_between_ranks_are_refused(comm):
    if comm.size == 1:
        pytest.skip("one rank cannot disagree with itself")
    net = small_network((64, 24, 10), fan_in=6, seed=3)
    mine = partition(net, parts=comm.size, method="cyclic" if comm.rank else "block")
    with pytest.raises(AgreedError, match="plan given in memory differs between ranks"):
        spdnn.train(net, run=spdnn.RunOptions(plan=mine, dtype="float64"),
                    options=spdnn.TrainOptions(epochs=1, max_steps=1), comm=comm)
    other = small_network((64, 24, 10), fan_in=6, seed=3 + comm.rank)
    plan = partition(net, parts=comm.size, method="cyclic")
    with pytest.raises(AgreedError, match="network given in memory differs between ranks"):
        spdnn.infer(other, run=spdnn.RunOptions(plan=plan), comm=comm)


@pytest.mark.parametrize("options, message", [
    (dict(epochs=0), "epochs must be a positive integer, not 0"),
    (dict(batch_size=2.5), "batch_size must be a positive integer"),
    (dict(lr=float("nan")), "lr must be a finite number >= 0"),
    (dict(momentum=-0.1), "momentum must be a finite number >= 0"),
    (dict(max_steps=0), "max_steps must be a positive integer"),
    (dict(loss="hinge"), "loss must be one of cross_entropy, mse"),
    (dict(critical_set=1.5), "critical_set must be a fraction in (0, 1]"),
    (dict(checkpoint_every=5), "checkpoint_every needs checkpoint_dir"),
    (dict(compress="topk:2"), "compress 'topk:2': the ratio must lie in (0, 1]"),
])
def test_bad_train_options_are_one_agreed_error(comm, options, message):
    net = small_network((64, 24, 10), fan_in=6, seed=3)
    plan = partition(net, parts=comm.size, method="cyclic")
    with pytest.raises(AgreedError) as err:
        spdnn.train(net, run=spdnn.RunOptions(plan=plan),
                    options=spdnn.TrainOptions(**options), comm=comm)
    assert message in str(err.value)


def test_bad_run_options_are_one_agreed_error(comm):
    net = small_network((64, 24, 10), fan_in=6, seed=3)
    with pytest.raises(AgreedError, match="exchange must be one of auto, dense, sparse"):
        spdnn.infer(net, run=spdnn.RunOptions(exchange="bitmaps"), comm=comm)


def test_option_records_of_another_type_are_refused_before_the_job(comm):
    """A dict where a record goes fails at the call, on every rank alike, naming the record
    (it failed deep in the job with an AttributeError); unlabelled arrays point to predict."""
    net = small_network((64, 24, 10), fan_in=6, seed=3)
    with pytest.raises(TypeError, match=r"options must be a spdnn.TrainOptions .* not dict"):
        spdnn.train(net, options={"epochs": 1}, comm=comm)
    for call in (lambda: spdnn.train(net, run={"plan": None}, comm=comm),
                 lambda: spdnn.infer(net, run="plan.npz", comm=comm),
                 lambda: spdnn.predict(net, np.zeros((2, 64)), run="plan.npz", comm=comm)):
        with pytest.raises(TypeError, match=r"run must be a spdnn.RunOptions"):
            call()
    for call in (lambda: spdnn.train(np.zeros(3), comm=comm),
                 lambda: spdnn.predict(None, np.zeros((2, 64)), comm=comm)):
        with pytest.raises(TypeError, match="network must be a network bundle's path or a "
                                            "spdnn.Network"):
            call()
    run = spdnn.RunOptions(plan=partition(net, parts=comm.size, method="cyclic"))
    with pytest.raises(AgreedError, match=r"without labels: spdnn.predict\(network, x\)"):
        spdnn.infer(net, inputs=np.zeros((2, 64)), run=run, comm=comm)


def test_the_partitioner_inside_an_mpi_job_does_not_fork(comm):
    """Inside a job of several ranks KaHyPar's children come from a fork server and --jobs
    runs in the rank itself; every rank finds the same plan."""
    from spdnn.comm.processes import child_context, fork_is_safe

    net = small_network((20, 24, 18, 6), fan_in=5, seed=1)
    if comm.size > 1:  # alone, it may fork unless a thread (a job's watchdog) still runs
        assert not fork_is_safe()
    assert child_context().get_start_method() == ("fork" if fork_is_safe() else "forkserver")
    plan = partition(net, parts=max(comm.size, 2), jobs=2)
    mine = np.concatenate(plan.owners)
    assert all(np.array_equal(mine, other) for other in comm.allgather(mine))


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("sparse", [False, True])
def test_arrays_in_predictions_out_equal_the_serial_reference(comm, mpi_tmp_path, replicas,
                                                              sparse):
    """A researcher's arrays (numpy, or scipy sparse) train the network as the serial
    reference does; ``predict`` gives every rank each sample's class and output scores, under
    a plan and with replicas."""
    import scipy.sparse as sp

    from spdnn.reference import predict as reference_predict

    if comm.size % replicas:
        pytest.skip(f"{comm.size} ranks do not hold {replicas} replicas")
    digits = load_dataset("digits", "float64")
    x, y, xt = digits.x_train[:200], digits.y_train[:200], digits.x_test[:37]
    if sparse:
        x, xt = sp.csr_matrix(x), sp.csr_matrix(xt)
    net = small_network((64, 24, 18, 10), fan_in=6, seed=3)
    plan = partition(net, parts=comm.size // replicas, method="cyclic")
    run = spdnn.RunOptions(plan=plan, dtype="float64", replicas=replicas)
    options = spdnn.TrainOptions(epochs=2, batch_size=32, lr=0.05, momentum=0.9, seed=5)
    saved = mpi_tmp_path / f"arrays-{replicas}-{sparse}.npz"
    result = spdnn.train(net, data=(x, y), run=run, options=options, save=saved, comm=comm,
                         return_network=True)
    expected, _ = reference_train(net, spdnn.Dataset(name="arrays", x_train=digits.x_train[:200],
                                                     y_train=y), 2, 32, SGDConfig(0.05, 0.9),
                                  seed=5)
    got = spdnn.load_network(saved)
    for a, b in zip(got.layers, expected.layers):
        np.testing.assert_allclose(a.weight.toarray(), b.weight.toarray(), rtol=0, atol=1e-10)
    # return_network: every rank holds the whole trained network
    assert result.network.sizes == net.sizes
    for a, b in zip(result.network.layers, expected.layers):
        np.testing.assert_array_equal(a.weight.indices, b.weight.indices)
        np.testing.assert_allclose(a.weight.data, b.weight.data, rtol=0, atol=1e-10)
        np.testing.assert_allclose(a.bias, b.bias, rtol=0, atol=1e-10)
    scores = spdnn.predict(saved, xt, run=run, scores=True, comm=comm)
    classes = spdnn.predict(saved, xt, run=run, comm=comm)
    want = reference_predict(expected, digits.x_test[:37])
    assert scores.shape == (37, 10) and classes.shape == (37,) and classes.dtype == np.int64
    np.testing.assert_allclose(scores, want, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(classes, np.argmax(want, axis=1))
    assert all(np.array_equal(classes, c) for c in comm.allgather(classes))


def test_arrays_that_are_wrong_or_differ_between_ranks_are_refused(comm):
    net = small_network((64, 24, 10), fan_in=6, seed=3)
    run = spdnn.RunOptions(plan=partition(net, parts=comm.size, method="cyclic"))
    x = np.zeros((20, 64))
    for data, message in (((x, np.zeros(19, int)), "one label per sample"),
                          ((x[:, :60], np.zeros(20, int)), "x has 60 features but the"),
                          ((x, np.full(20, -1)), "negative label"),
                          ((x, np.full((20, 10), np.inf)), "a target that is not finite"),
                          ((x, np.zeros((20, 3))), "3 targets per sample but the network "
                                                   "has 10 outputs"),
                          ((x, np.zeros((20, 10))), "loss must be mse for real-valued"),
                          ((np.full((20, 64), np.nan), np.zeros(20, int)), "NaN"),
                          ((x,), "data must be")):
        with pytest.raises(AgreedError, match=message):
            spdnn.train(net, data=data, run=run, options=spdnn.TrainOptions(epochs=1),
                        comm=comm)
    with pytest.raises(AgreedError, match="inputs has 63 features"):
        spdnn.predict(net, x[:, :63], run=run, comm=comm)
    if comm.size > 1:
        mine = (x[: 20 - comm.rank], np.zeros(20 - comm.rank, int))
        with pytest.raises(AgreedError, match="data in memory differs between ranks"):
            spdnn.train(net, data=mine, run=run, options=spdnn.TrainOptions(epochs=1),
                        comm=comm)


def test_a_call_leaves_the_callers_kernel_threads_as_they_were(comm):
    """``run.threads`` holds inside the call; numba's thread count afterwards is the caller's."""
    numba = pytest.importorskip("numba")
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba's pool has one thread here (NUMBA_NUM_THREADS)")
    from spdnn.kernels import callers_threads_kept, set_threads

    net = small_network((64, 24, 10), fan_in=6, seed=3)
    x = np.random.default_rng(0).random((5, 64))
    numba.set_num_threads(2)
    run = spdnn.RunOptions(plan=partition(net, parts=comm.size, method="cyclic"), threads=1,
                           dtype="float64")
    spdnn.predict(net, x, run=run, comm=comm)
    assert numba.get_num_threads() == 2
    with callers_threads_kept():
        set_threads(1)
        assert numba.get_num_threads() == 1
    assert numba.get_num_threads() == 2
    # A kernel called directly afterwards runs on this rank's count again, not the caller's
    # (the MPI tests after this one once ran their kernels on 2 threads a rank).
    from spdnn.kernels import products

    w = net.layers[0].weight.tocsr()
    products.spmm(w, np.ascontiguousarray(x.T))
    assert numba.get_num_threads() == products.threads() == 1


def test_real_valued_targets_train_as_the_serial_reference_on_every_grid(comm):
    """y as samples x outputs trains with the mse loss against those values (a regression):
    the weights, the training and validation losses equal the serial reference's under
    every grid; there is no accuracy to report."""
    from spdnn.io.dataset import split_validation
    from spdnn.optim import AdamConfig
    from tests.test_replicas_mpi import grids

    rng = np.random.default_rng(0)
    x = rng.standard_normal((90, 20))
    t = np.stack([np.sin(x[:, 0]) + x[:, 1], x[:, 2] * x[:, 3], -x[:, 4]], axis=1)
    net = small_network((20, 24, 18, 3), fan_in=5, seed=4, bias_scale=0.3)
    held = split_validation(spdnn.Dataset(name="t", x_train=x, y_train=t), 0.2)
    expected, reports = reference_train(net, held, 3, 16, AdamConfig(lr=0.01), seed=3,
                                        loss="mse")
    options = spdnn.TrainOptions(epochs=3, batch_size=16, optimizer="adam", lr=0.01,
                                 loss="mse", seed=3, validation_split=0.2)
    for parts, replicas in grids(comm.size):
        run = spdnn.RunOptions(plan=partition(net, parts=parts, method="cyclic"),
                               dtype="float64", replicas=replicas)
        result = spdnn.train(net, data=(x, t), run=run, options=options, comm=comm,
                             return_network=True)
        for a, b in zip(result.network.layers, expected.layers):
            np.testing.assert_allclose(a.weight.toarray(), b.weight.toarray(), rtol=0,
                                       atol=1e-10)
            np.testing.assert_allclose(a.bias, b.bias, rtol=0, atol=1e-10)
        np.testing.assert_allclose([r.loss for r in result.epochs],
                                   [r.loss for r in reports], rtol=1e-10)
        np.testing.assert_allclose([r.validation_loss for r in result.epochs],
                                   [r.validation_loss for r in reports], rtol=1e-10)
        assert all(r.train_accuracy is None and r.validation_accuracy is None
                   for r in result.epochs)
    with pytest.raises(AgreedError, match="loss must be mse for real-valued targets"):
        spdnn.train(net, data=(x, t), options=spdnn.TrainOptions(epochs=1), comm=comm,
                    run=spdnn.RunOptions(replicas=comm.size))


def test_thousands_of_calls_do_not_run_out_of_communicators(comm):
    """Each call's grid (communicators split from the job's) is freed when it returns: MPICH
    holds 2,048 communicators a process, and a grid search makes thousands of calls."""
    net = small_network((8, 6, 3), fan_in=2, seed=1)
    x = np.ones((2, 8))
    run = spdnn.RunOptions(replicas=comm.size)
    before = comm.split_count
    for _ in range(1100):  # 2 splits a call
        spdnn.predict(net, x, run=run, comm=comm)
    assert comm.split_count == before
