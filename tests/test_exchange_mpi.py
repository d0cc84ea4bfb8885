"""Sparse exchange (``--exchange``): every mode computes what the serial reference computes, and
sends the bytes its encodings should. Run under mpiexec -n 1, 2, 3 and 4."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from spdnn import reference
from spdnn.kernels.encoding import MODES, slope_mask
from spdnn.model.generate import radixnet
from spdnn.model.network import Layer, Network
from spdnn.reference import challenge_infer as reference_challenge
from spdnn.runtime.inference import challenge_infer
from tests.helpers import small_network
from tests.test_runtime_mpi import _images, _setup, _train_and_compare

pytestmark = pytest.mark.mpi


def _shaped_network(cap):
    """Layer 2 saturates (bias +30: every activation positive, or exactly at the cap) and
    layer 3 dies (bias -30: every activation zero), so the exchanges of layers 3 and 4 carry
    fully dense, at-cap and all-zero blocks and empty folds, beside the mixed ones of layer 2."""
    net = small_network((20, 24, 18, 16, 6), fan_in=5, seed=1, cap=cap, bias_scale=0.3)
    net.layers[1].bias[:] = 30.0
    net.layers[2].bias[:] = -30.0
    return net


@pytest.mark.parametrize("exchange", MODES)
@pytest.mark.parametrize("cap", [None, 2.0])
def test_every_mode_equals_the_serial_reference(comm, mpi_tmp_path, exchange, cap):
    _train_and_compare(comm, mpi_tmp_path, _shaped_network(cap), "cyclic", 1e-10,
                       exchange=exchange)


def _integer_network(cap):
    """Small-integer weights, biases and inputs: every sum is exact in float64, so the
    activations here and in the reference agree to the bit, zeros included."""
    rng = np.random.default_rng(3)
    sizes = (16, 20, 14, 10)
    layers = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        w = sp.random(n_out, n_in, density=0.3, random_state=rng, format="csr",
                      data_rvs=lambda k: rng.integers(-2, 3, k).astype(float))
        w.eliminate_zeros()
        layers.append(Layer(w, rng.integers(-2, 3, n_out).astype(float)))
    return Network(layers=tuple(layers), cap=cap, output_activation="linear")


def _expected_bytes(net, x0, owners, size, exchange):
    """Per layer, the bytes every rank together should send in one forward and one backward
    pass, recounted from the reference activations and the plan (not the runtime's
    schedules): the rows of layer k-1 that rank r owns and rank q's rows of layer k use."""
    _, xs = reference.forward(net, x0)
    item = 8
    fwd, bwd, saturated = [], [], 0
    for k, layer in enumerate(net.layers):
        coo = layer.weight.tocoo()
        f = b = 0
        for r in range(size):
            for q in range(size):
                if q == r:
                    continue
                used = coo.col[(owners[k + 1][coo.row] == q) & (owners[k][coo.col] == r)]
                rows = np.unique(used)
                if not len(rows):
                    continue
                block = xs[k][rows]
                n, nnz = block.size, int(np.count_nonzero(block))
                at_cap = int(np.count_nonzero(block == net.cap)) if net.cap else 0
                saturated += at_cap
                # header (16 bytes), the values neither zero nor at the cap, a bit per entry,
                # and with a cap a second bit per entry
                sparse = 16 + (nnz - at_cap) * item + -(-n // 8) * (2 if net.cap else 1)
                f += {"dense": n * item, "sparse": sparse,
                      "auto": min(16 + n * item, sparse)}[exchange]
                if k > 0:  # no fold into the inputs
                    kept = int(np.count_nonzero(slope_mask(block, net.cap)))
                    b += {"dense": n * item, "sparse": kept * item,
                          "auto": kept * item if kept < n else n * item}[exchange]
        fwd.append(f)
        bwd.append(b)
    return fwd, bwd, saturated


@pytest.mark.parametrize("exchange", MODES)
@pytest.mark.parametrize("cap", [None, 2.0])
def test_bytes_sent_equal_an_independent_recount(comm, mpi_tmp_path, exchange, cap):
    net = _integer_network(cap)
    run = _setup(mpi_tmp_path, net, "cyclic", comm, exchange=exchange)
    dnet = run.dnet
    rng = np.random.default_rng(9)
    x0 = rng.integers(0, 3, (net.sizes[0], 11)).astype(float)
    y = rng.integers(0, net.sizes[-1], 11)
    dnet.backward(dnet.forward(np.ascontiguousarray(x0[dnet.input_rows])), y, "cross_entropy")
    sent = dnet.traffic.total(comm)
    fwd, bwd, saturated = _expected_bytes(net, x0, run.plan.owners, comm.size, exchange)
    assert sent.forward_sent.tolist() == fwd
    assert sent.backward_sent.tolist() == bwd
    if comm.size > 1:
        assert sum(fwd) > 0 and sum(bwd) > 0
        assert (saturated > 0) == (cap is not None)  # the at-cap code is exercised


@pytest.mark.parametrize("exchange", MODES)
def test_graph_challenge_mode_in_every_exchange_mode(comm, mpi_tmp_path, exchange):
    net = radixnet(1024, 12, seed=0, dtype="float64")
    images = _images(120)
    expected = reference_challenge(net, images)
    run = _setup(mpi_tmp_path, net, "cyclic", comm, "rx", exchange=exchange)
    got = challenge_infer(comm, run.dnet, images, run.nnz)
    np.testing.assert_array_equal(got.categories, expected.categories)


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize("exchange", ["auto", "sparse"])
def test_no_exchange_keeps_a_message_buffer_the_pool_let_go(comm, mpi_tmp_path, exchange,
                                                             dtype):
    """Both directions share the pool's two message buffers, which grow with the largest
    layer's messages. A layer's exchange keeps no view of a buffer the pool has replaced:
    such a view kept every smaller buffer alive beside the grown one (about 30 MB of a 600 MB
    rank at P = 4, unseen by the prediction). The fold packs its partial sums in place, so
    the ghost side holds the forward's encoded rows alone; under bfloat16 a training step
    stages them in its workspace, beside the Z they are summed into."""
    from spdnn.runtime.halo import GHOST_SIDE, SENT_SIDE

    net = small_network((20, 8, 40, 40, 6), fan_in=5, seed=2)  # later layers' messages grow
    run = _setup(mpi_tmp_path, net, "cyclic", comm, exchange=exchange, dtype=dtype)
    dnet = run.dnet
    rng = np.random.default_rng(4)
    x0 = rng.random((net.sizes[0], 9))
    y = rng.integers(0, net.sizes[-1], 9)
    dnet.backward(dnet.forward(np.ascontiguousarray(x0[dnet.input_rows])), y, "cross_entropy")
    pool = dnet.layers[0].exchange._buffers
    assert set(pool) <= {SENT_SIDE, GHOST_SIDE}
    for layer in dnet.layers:
        assert layer.exchange._buffers is pool
        stage = layer.exchange._stage
        assert stage.size == 0 or stage.base is pool[GHOST_SIDE]
    if comm.size == 1:
        return
    expand = max(layer.exchange._in_list[-1] for layer in dnet.layers)
    if dtype == "float64":
        assert pool[GHOST_SIDE].nbytes == expand > 0
    else:  # the arrivals are staged in the workspace's block, after Z (forward pass alone)
        assert GHOST_SIDE not in pool
        (ws,) = dnet.workspaces()
        assert {id(s.base) for s in ws.stages if s is not None} == {id(ws.zs[0].base)}
