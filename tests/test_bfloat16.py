"""bfloat16: the conversions against torch's and against the reference's own rounding, the
kernels' bfloat16 blocks against numpy on the widened values, and what a bfloat16 run refuses.
Distributed runs against the serial reference: tests/test_bfloat16_mpi.py."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from spdnn.errors import InputError, OptionError, SpdnnError
from spdnn.io.bundle import load_network
from spdnn.io.loaders import Dataset
from spdnn.kernels import bfloat16 as bf
from spdnn.kernels import products as kernels
from spdnn.model.options import RunOptions, TrainOptions, check_bfloat16_training, check_run_options
from spdnn.optim import AdamConfig, SGDConfig
from spdnn.reference import train as reference_train
from spdnn.reference.bfloat16 import rounded as reference_rounded
from tests.helpers import import_torch, launch, small_network


def _values(n: int = 200_000) -> np.ndarray:
    """Values over float32's whole range (subnormals, ties, the largest and infinities)."""
    rng = np.random.default_rng(0)
    wide = rng.standard_normal(n) * 10.0 ** rng.integers(-45, 39, n)
    bits = rng.integers(0, 2**32, n // 4, dtype=np.uint64).astype(np.uint32).view(np.float32)
    ties = (np.arange(1, 1000, dtype=np.uint32) << 16 | 0x8000).view(np.float32)
    special = np.array([0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, 3.4028235e38, -3.4028235e38,
                        3.3961776e38, np.inf, -np.inf, -0.3, 1 / 16, 32, 1.0, 0.1], np.float32)
    with np.errstate(over="ignore"):
        out = np.concatenate([wide.astype(np.float32), bits, ties, special])
    return out[~np.isnan(out)]


def test_narrowing_rounds_as_torch_converts():
    torch = pytest.importorskip("torch")
    x = _values()
    expected = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bf.narrow(x), expected)
    widened = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(bf.widen(bf.narrow(x)).view(np.uint32), widened.view(np.uint32))
    assert np.isnan(bf.widen(bf.narrow(np.array([np.nan], np.float32))))[0]


def test_the_reference_rounds_as_the_kernels_by_another_route():
    """Mantissa rounding by numpy's round (half to even) agrees with the bit arithmetic."""
    x = _values()
    np.testing.assert_array_equal(reference_rounded(x).view(np.uint32),
                                  bf.rounded(x).view(np.uint32))
    # what the Graph Challenge's constants become
    np.testing.assert_array_equal(bf.rounded(np.array([1 / 16, 32, -0.3], np.float32)),
                                  np.array([0.0625, 32, -0.30078125], np.float32))


def test_the_numba_conversions_equal_numpys():
    pytest.importorskip("numba")
    from spdnn.kernels import _numba_bfloat16 as nbf

    x = _values()[:250_000].reshape(-1, 100)
    out, sums = np.empty(x.shape, np.uint16), np.empty(len(x), np.float32)
    nbf.narrow_rows(x, out, sums)
    np.testing.assert_array_equal(out, bf.narrow(x))
    block = np.random.default_rng(1).standard_normal((50, 300)).astype(np.float32)
    rounded, sums = np.empty(block.shape, np.uint16), np.empty(50, np.float32)
    nbf.narrow_rows(block, rounded, sums)  # the row sums of what was stored
    np.testing.assert_allclose(sums, bf.widen(rounded).astype(np.float64).sum(axis=1),
                               rtol=1e-5, atol=1e-5)
    flat = np.empty(x.size, np.uint16)
    nbf.narrow_flat(x.reshape(-1), flat)
    np.testing.assert_array_equal(flat, bf.narrow(x).reshape(-1))


@pytest.mark.parametrize("backend", ["numba", "scipy"])
def test_every_backend_rounds_blocks_and_weights_alike(backend):
    """The rounded copies the products gather (spdnn.kernels.rounding) under each backend: the
    block's bits as numpy rounds them, its rows' sums of what was stored, the weights' bits."""
    from spdnn.kernels import rounding

    if backend not in kernels.available_backends():
        pytest.skip(f"the {backend} backend is not installed")
    before = kernels.backend()
    block = np.random.default_rng(5).standard_normal((40, 70)).astype(np.float32)
    out, sums = np.empty(block.shape, np.uint16), np.full(40, np.nan, np.float32)
    weights = _values()[:10_001]
    copy = np.empty(weights.size, np.uint16)
    try:
        kernels.set_backend(backend)
        rounding.round_rows(block, out, sums)
        rounding.round_weights(weights, copy)
    finally:
        kernels.set_backend(before)
    np.testing.assert_array_equal(out, bf.narrow(block))
    np.testing.assert_allclose(sums, bf.widen(out).astype(np.float64).sum(axis=1),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(copy, bf.narrow(weights))


def _case(batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = sp.random(37, 29, density=0.3, format="csr", random_state=seed, dtype=np.float32)
    w.sort_indices()
    w16 = sp.csr_matrix((bf.narrow(w.data), w.indices, w.indptr), shape=w.shape)
    x16 = bf.narrow(rng.standard_normal((29, batch)).astype(np.float32))
    d16 = bf.narrow(rng.standard_normal((37, batch)).astype(np.float32))
    wide = sp.csr_matrix((bf.widen(w16.data).astype(np.float64), w.indices, w.indptr),
                         shape=w.shape)
    return w16, x16, d16, wide


@pytest.mark.parametrize("batch", [1, 5, 8, 16, 17, 31, 33, 64, 100, 129])
@pytest.mark.parametrize("cap", [None, 0.5])
def test_the_products_read_bfloat16_blocks(batch, cap):
    """W X + b with bfloat16 W and X summed in float32 (Z), h(Z) stored rounded to nearest
    even; the backward pass's W^T d and d . x from bfloat16 d, W and x, in float32. Widths
    cover the narrow kernels (up to 32 columns) and the blocks of 16 lanes."""
    pytest.importorskip("numba")
    if kernels.backend() != "numba":
        pytest.skip("bfloat16 products are the numba backend's")
    w16, x16, d16, wide = _case(batch)
    x, d = bf.widen(x16).astype(np.float64), bf.widen(d16).astype(np.float64)
    bias = np.random.default_rng(3).standard_normal(37).astype(np.float32)
    z = np.full((37, batch), np.nan, np.float32)
    h = np.zeros((37, batch), np.uint16)
    kernels.spmm_act(w16, x16, bias, cap, z, h)
    expected = wide @ x + bias[:, None]
    np.testing.assert_allclose(z, expected, rtol=1e-5, atol=1e-5)
    relu = np.maximum(z, 0) if cap is None else np.minimum(np.maximum(z, 0), cap)
    np.testing.assert_array_equal(h, bf.narrow(relu))  # rounded from the float32 Z
    # backward: W^T d on rows of the transpose, the weight gradient in W's order
    wt = kernels.transpose(w16)
    g = np.full((29, batch), np.nan, np.float32)
    grad = np.full(w16.nnz, np.nan, np.float32)
    kernels.backward_products(wt, w16.data, d16, x16, g, grad)
    np.testing.assert_allclose(g, wide.T @ d, rtol=1e-5, atol=1e-5)
    coo = w16.tocoo()
    np.testing.assert_allclose(grad, np.einsum("ij,ij->i", d[coo.row], x[coo.col]),
                               rtol=1e-5, atol=1e-5)
    out, bias_grad = np.full(w16.nnz, np.nan, np.float32), np.zeros(37, np.float32)
    kernels.sddmm(w16, d16, x16, out, bias_grad=bias_grad)
    np.testing.assert_allclose(out, grad, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bias_grad, d.sum(axis=1), rtol=1e-5, atol=1e-5)


def test_a_dense_bfloat16_layer_reads_each_input_row_once_to_the_gathers_bits(monkeypatch):
    """BLAS has no bfloat16: a layer storing every entry (a dense head) runs a kernel of its
    own, which reads each row of X once for all rows of W. Each sum runs in column order from
    its start, with fused multiply-adds, as the gathers' sums do: the same bits, over a span
    of columns, accumulated, over a range of rows and with the rows shared by two threads
    (29 columns: blocks of 8 and a tail). Narrower batches run the gathers."""
    pytest.importorskip("numba")
    if kernels.backend() != "numba":
        pytest.skip("bfloat16 products are the numba backend's")
    from spdnn.kernels import _numba_products as nbp

    rng = np.random.default_rng(2)
    from spdnn.kernels.dense import DENSE_ROWS_MIN_BATCH

    rows, cols, batch = 6, 29, DENSE_ROWS_MIN_BATCH + 3
    w16 = sp.csr_matrix((bf.narrow(rng.standard_normal(rows * cols).astype(np.float32)),
                         np.tile(np.arange(cols), rows), np.arange(0, rows * cols + 1, cols)),
                        shape=(rows, cols))
    x16 = bf.narrow(rng.standard_normal((cols, batch)).astype(np.float32))
    bias = rng.standard_normal(rows).astype(np.float32)
    gathers, calls = nbp.spmm_rows, []
    monkeypatch.setattr(nbp, "spmm_rows", lambda *a: calls.append(1) or gathers(*a))
    owned = (w16.indptr[:-1] + 3, w16.indptr[:-1] + 20)  # columns 3 to 19
    for span, r, acc in ((None, None, False), (owned, (1, 5), True)):
        z = rng.standard_normal((rows, batch)).astype(np.float32)
        start, expected, threads = z.copy(), z.copy(), z.copy()
        kernels.spmm_act(w16, x16, None if acc else bias, None, z, None, r, acc, span=span)
        assert not calls  # not the gathers
        r0, r1 = (0, rows) if r is None else r
        starts, ends = span if span is not None else (w16.indptr[:-1], w16.indptr[1:])
        init = 0 if acc else 1
        gathers(starts, ends, w16.indices, w16.data, x16, bias, expected, r0, r1, init, -1.0,
                False, expected, np.zeros(0, np.int32), 1)
        np.testing.assert_array_equal(z, expected)
        lo, hi = int(starts[r0] - w16.indptr[r0]), int(ends[r0] - w16.indptr[r0])
        nbp.dense_rows(w16.data.reshape(rows, cols), x16, lo, hi, bias, threads, r0, r1,
                       init, 2)
        np.testing.assert_array_equal(threads, expected)
        wide = bf.widen(w16.data).reshape(rows, cols)[r0:r1, lo:hi].astype(np.float64)
        np.testing.assert_allclose(
            z[r0:r1], wide @ bf.widen(x16[lo:hi]) + (start[r0:r1] if acc else bias[r0:r1, None]),
            rtol=1e-5, atol=1e-5)
    narrow = np.zeros((rows, DENSE_ROWS_MIN_BATCH - 1), np.float32)
    kernels.spmm_act(w16, np.ascontiguousarray(x16[:, 1:DENSE_ROWS_MIN_BATCH]), bias, None,
                     narrow, None)
    assert calls


@pytest.mark.parametrize(("field", "value"), [("dropout", 0.1), ("lsh", 1),
                                               ("sparse_update", "set"),
                                               ("critical_set", 0.5)])
def test_a_bfloat16_training_refuses_what_it_does_not_do_by_name(field, value):
    opt = TrainOptions(**{field: value})
    with pytest.raises(OptionError, match=f"{field} does not apply with dtype bfloat16"):
        check_bfloat16_training(RunOptions(dtype="bfloat16"), opt)
    check_bfloat16_training(RunOptions(dtype="float32"), opt)


def test_bfloat16_run_options_refuse_streaming():
    with pytest.raises(OptionError, match="stream_layers does not apply"):
        check_run_options(RunOptions(dtype="bfloat16", stream_layers=2))
    check_run_options(RunOptions(dtype="bfloat16", exchange="sparse"))


def test_a_network_whose_slopes_read_z_is_refused_under_bfloat16(tmp_path):
    from spdnn.io.bundle import NetworkBundle, save_network
    from spdnn.runtime.session import check_bfloat16_network

    net = small_network((8, 6, 5, 4), activations=("gelu", "leaky_relu:0.2"), dtype="float32")
    save_network(net, tmp_path / "gelu.npz")
    with pytest.raises(InputError, match=r"/gelu.npz: --dtype bfloat16 trains hidden layers of "
                                         r"relu, tanh, sigmoid, identity only yet \(their "
                                         r"slopes need no Z\), not gelu, leaky_relu:0.2$"):
        check_bfloat16_network(NetworkBundle(str(tmp_path / "gelu.npz")))
    fine = small_network((8, 6, 5, 4), activations=("tanh", "sigmoid"), dtype="float32")
    save_network(fine, tmp_path / "tanh.npz")
    check_bfloat16_network(NetworkBundle(str(tmp_path / "tanh.npz")))


@pytest.mark.parametrize("name", ["tanh", "sigmoid"])
def test_the_slopes_read_bfloat16_outputs_as_their_widened_values(name):
    """tanh's and sigmoid's compiled slopes on bfloat16 outputs: the same bits as on the
    outputs widened to float32, the definition's formula of them to rounding, and a bfloat16
    step away from the slope of the unrounded outputs."""
    from spdnn.model.activations import parse

    pytest.importorskip("numba")
    act = parse(name)
    rng = np.random.default_rng(4)
    z = rng.standard_normal((9, 37)).astype(np.float32)
    h = bf.narrow(act.apply(z))
    g0 = rng.standard_normal(z.shape).astype(np.float32)
    before = kernels.backend()
    try:
        kernels.set_backend("numba")
        half, wide, exact = g0.copy(), g0.copy(), g0.copy()
        kernels.activation_backward(act, half, z, h)
        kernels.activation_backward(act, wide, z, bf.widen(h))
        kernels.activation_backward(act, exact, z, act.apply(z))
        np.testing.assert_array_equal(half, wide)
        np.testing.assert_allclose(half, g0 * act.slope_of(z, bf.widen(h)), rtol=1e-6)
        assert np.abs(half - exact).max() > 1e-4 * np.abs(exact).max()  # h rounded is read
        kernels.set_backend("scipy")
        with pytest.raises(ValueError, match="no bfloat16 outputs"):
            kernels.activation_backward(act, g0.copy(), z, h)
    finally:
        kernels.set_backend(before)


def test_the_scipy_backend_refuses_bfloat16(tmp_path):
    from spdnn.io.bundle import NetworkBundle, save_network
    from spdnn.runtime.session import check_bfloat16_network

    save_network(small_network((8, 6, 4), dtype="float32"), tmp_path / "relu.npz")
    before = kernels.backend()
    try:
        kernels.set_backend("scipy")
        with pytest.raises(SpdnnError, match="needs the numba kernels"):
            check_bfloat16_network(NetworkBundle(str(tmp_path / "relu.npz")))
    finally:
        kernels.set_backend(before)


def test_the_command_line_refuses_dropout_under_bfloat16_in_one_line(tmp_path):
    from spdnn.io.bundle import save_network

    save_network(small_network((64, 16, 10), dtype="float32"), tmp_path / "net.npz")
    proc = launch(1, "train", "--network", tmp_path / "net.npz", "--data", "digits",
                  "--dtype", "bfloat16", "--dropout", "0.2", "--save", tmp_path / "out.npz")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "spdnn: error: --dropout does not apply with --dtype bfloat16 yet: its masks would "
        "scale the 16-bit activations after their rounding"]
    assert not (tmp_path / "out.npz").exists()


def _runtime_train(net, x, y, config, epochs, batch):
    """The runtime on one process: a bfloat16 run of ``net`` (batches in file order)."""
    from spdnn.comm.mpi import Communicator
    from spdnn.io.loaders import Dataset
    from spdnn.runtime.session import gather_network, open_network
    from spdnn.runtime.training import TrainConfig, train

    comm = Communicator.self_only()
    run = open_network(comm, net, None, "bfloat16")
    train(comm, run.dnet, Dataset(name="t", x_train=x, y_train=y),
          TrainConfig(epochs=epochs, batch_size=batch, optimizer=config, shuffle=False))
    trained = gather_network(run.dnet)
    run.dnet.grid.free()
    return trained


def _torch_bfloat16_train(net, x, y, name, kwargs, epochs, batch, *, autocast):
    """torch with float32 master weights under each layer's mask. ``autocast``: torch's own
    mixed precision (torch.autocast: bfloat16 products, Z and gradients); else spdnn's
    rounding points written with torch: the weights, inputs and activations rounded going
    forward, the error dL/dZ of every layer rounded going backward, every sum float32."""
    torch = import_torch()
    f = torch.nn.functional

    class Rounded(torch.autograd.Function):  # bfloat16 forward; the gradient passes as is
        @staticmethod
        def forward(ctx, t):  # noqa: ANN001, ANN205
            return t.to(torch.bfloat16).float()

        @staticmethod
        def backward(ctx, g):  # noqa: ANN001, ANN205
            return g

    class RoundedError(torch.autograd.Function):  # identity forward; bfloat16 gradient
        @staticmethod
        def forward(ctx, t):  # noqa: ANN001, ANN205
            return t.clone()

        @staticmethod
        def backward(ctx, g):  # noqa: ANN001, ANN205
            return g.to(torch.bfloat16).float()

    hidden = [net.hidden(k).torch(torch.nn) for k in range(1, net.n_layers)]
    # torch's own backward formulas of an output h (ReLU's mask, tanh's, sigmoid's)
    slopes = {"relu": lambda g, h: torch.ops.aten.threshold_backward(g, h, 0),
              "tanh": torch.ops.aten.tanh_backward, "sigmoid": torch.ops.aten.sigmoid_backward}

    class RoundedOutput(torch.autograd.Function):  # h rounded; the slope read from it
        @staticmethod
        def forward(ctx, z, k):  # noqa: ANN001, ANN205
            h = hidden[k](z).to(torch.bfloat16).float()
            ctx.save_for_backward(h)
            ctx.slope = slopes[net.hidden(k + 1).name]
            return h

        @staticmethod
        def backward(ctx, g):  # noqa: ANN001, ANN205
            return ctx.slope(g, ctx.saved_tensors[0]), None

    weights = [torch.tensor(lay.weight.toarray(), dtype=torch.float32, requires_grad=True)
               for lay in net.layers]
    masks = [torch.tensor(lay.weight.toarray() != 0) for lay in net.layers]
    biases = [torch.tensor(lay.bias, dtype=torch.float32, requires_grad=True)
              for lay in net.layers]
    opt = getattr(torch.optim, name)([p for pair in zip(weights, biases) for p in pair],
                                     **kwargs)
    xt, yt = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
    for _ in range(epochs):
        for s in range(0, len(x), batch):
            opt.zero_grad()
            h = xt[s:s + batch]
            if autocast:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    for k, (w, m, b) in enumerate(zip(weights, masks, biases)):
                        h = f.linear(h, w * m, b)
                        h = hidden[k](h) if k + 1 < len(weights) else h
                loss = f.cross_entropy(h.float(), yt[s:s + batch])
            else:
                h = Rounded.apply(h)
                for k, (w, m, b) in enumerate(zip(weights, masks, biases)):
                    z = RoundedError.apply(h @ Rounded.apply(w * m).T + b)
                    h = RoundedOutput.apply(z, k) if k + 1 < len(weights) else z
                loss = f.cross_entropy(h, yt[s:s + batch])
            loss.backward()
            opt.step()
    return [(w * m).detach().numpy() for w, m in zip(weights, masks)], \
        [b.detach().numpy() for b in biases]


TORCH_CASES = {
    "sgd": (SGDConfig(lr=0.1, momentum=0.9), "SGD", dict(lr=0.1, momentum=0.9)),
    "adam": (AdamConfig(lr=0.01), "Adam", dict(lr=0.01)),
}


def _two_epochs(case: str, acts: tuple[str, ...] = ()):  # noqa: ANN202
    """The torch tests' case: its config, the masked network (ReLU, or the hidden
    activations ``acts``), the data and spdnn's runtime trained on it in bfloat16 for two
    epochs of batch 8."""
    pytest.importorskip("numba")
    config = TORCH_CASES[case][0]
    net = small_network((12, 16, 10, 5), fan_in=4, seed=3, bias_scale=0.3, dtype="float32",
                        activations=acts)
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((30, 12)).astype(np.float32), rng.integers(0, 5, 30)
    return config, net, x, y, _runtime_train(net, x, y, config, 2, 8)


ACTIVATION_CASES = [(), ("tanh", "sigmoid")]


@pytest.mark.parametrize("acts", ACTIVATION_CASES, ids=["relu", "tanh-sigmoid"])
@pytest.mark.parametrize("case", sorted(TORCH_CASES))
def test_bfloat16_training_equals_torch_at_the_same_rounding_points(case, acts):
    """Two epochs on the same masked network: spdnn's runtime in bfloat16 and torch with
    the same rounding points (float32 sums, master weights and optimizer; the slopes by
    torch's backward formulas of the rounded outputs), within float32 rounding (1e-5); the
    float32 run is 50 x further away (57 to 4,825 x measured)."""
    config, net, x, y, ours = _two_epochs(case, acts)
    weights, biases = _torch_bfloat16_train(net, x, y, *TORCH_CASES[case][1:], 2, 8,
                                            autocast=False)
    for lay, w, b in zip(ours.layers, weights, biases):
        np.testing.assert_allclose(lay.weight.toarray(), w, rtol=0, atol=1e-5)
        np.testing.assert_allclose(lay.bias, b, rtol=0, atol=1e-5)
    plain, _ = reference_train(net, Dataset(name="t", x_train=x, y_train=y), 2, 8, config,
                               shuffle=False)
    far = max(np.abs(a.weight.toarray() - w).max() for a, w in zip(plain.layers, weights))
    assert far > 5e-4


@pytest.mark.parametrize("acts", ACTIVATION_CASES, ids=["relu", "tanh-sigmoid"])
@pytest.mark.parametrize("case", sorted(TORCH_CASES))
def test_bfloat16_training_stays_near_torchs_autocast(case, acts):
    """torch.autocast rounds Z and the weight gradients to bfloat16 too (spdnn keeps both in
    float32): after two epochs no weight differs by a bfloat16 step of the largest weight
    (2^-8 of it; measured with ReLU: a seventh of that under SGD, a thirtieth under Adam;
    with tanh and sigmoid a sixteenth and a thirteenth)."""
    _, net, x, y, ours = _two_epochs(case, acts)
    weights, _ = _torch_bfloat16_train(net, x, y, *TORCH_CASES[case][1:], 2, 8, autocast=True)
    scale = max(np.abs(w).max() for w in weights)
    worst = max(np.abs(lay.weight.toarray() - w).max() for lay, w in zip(ours.layers, weights))
    assert worst < 2.0 ** -8 * scale, (worst, scale)


@pytest.mark.parametrize("batch", [1, 7, 16, 31, 32, 33, 70])
def test_bfloat16_rows_encode_and_fold_exactly(batch):
    """The sparse form of bfloat16 rows (zeros, -0.0, the rounded cap and values) decodes
    bit for bit; the folds pack and add float32 partial sums under the slope of bfloat16
    outputs (0 < h < the rounded cap) as numpy's mask says."""
    pytest.importorskip("numba")
    if kernels.backend() != "numba":
        pytest.skip("bfloat16 exchanges are the numba backend's")
    from spdnn.kernels import encoding

    rng = np.random.default_rng(batch)
    cap = float(bf.rounded(np.array([0.7], np.float32))[0])
    h = np.maximum(rng.standard_normal((40, batch)).astype(np.float32), 0)
    h[rng.random(h.shape) < 0.2] = cap
    h[0, :1] = -0.0
    x = bf.narrow(np.minimum(h, cap))
    rows = rng.permutation(40)[:23].astype(np.int64)
    sent = x[rows]
    carried = int(np.count_nonzero((sent != 0) & (sent != bf.narrow(np.float32([cap]))[0])))
    n = sent.size  # the sparse form: the values neither zero nor at the cap, two bitmaps
    sparse = encoding.HEADER + 2 * carried + 2 * ((n + 7) // 8)
    for mode in ("sparse", "auto"):
        out = np.zeros(encoding.expand_capacity(len(rows), batch, 2), np.uint8)
        size = encoding.encode_rows(x, rows, mode, cap, out)
        assert size == (sparse if mode == "sparse" else
                        min(sparse, encoding.dense_bytes(n, 2))), (mode, size, sparse)
        back = np.full((len(rows), batch), 0xFFFF, np.uint16)
        encoding.decode_rows(out[:size], back, cap, "test")
        np.testing.assert_array_equal(back, x[rows])
    wide = bf.widen(x)
    mask = (wide[rows] > 0) & (wide[rows] < cap)
    partials = rng.standard_normal((len(rows), batch)).astype(np.float32)
    assert encoding.slope_count(x, rows, cap) == mask.sum()
    packed = np.zeros(partials.size, np.float32)
    n = encoding.fold_pack(partials, x, rows, cap, packed)
    np.testing.assert_array_equal(packed[:n], partials[mask])
    g = rng.standard_normal((40, batch)).astype(np.float32)
    expected = g.copy()
    expected[rows] += np.where(mask, partials, 0)
    encoding.fold_add(g, rows, packed[:n], x, cap)
    np.testing.assert_array_equal(g, expected)


def _bf16_safetensors(path, torch):  # noqa: ANN001
    """A pruned 20-16-4 model saved by torch in bfloat16; its tensors."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    tensors = {}
    for name, (n_out, n_in) in (("fc1", (16, 20)), ("fc2", (4, 16))):
        w = torch.randn(n_out, n_in)
        w[torch.rand_like(w) < 0.6] = 0
        tensors[f"{name}.weight"] = w.to(torch.bfloat16)
        tensors[f"{name}.bias"] = torch.randn(n_out).to(torch.bfloat16)
    save_file(tensors, str(path))
    return tensors


def test_a_bfloat16_safetensors_file_stays_bfloat16_unless_asked(tmp_path):
    """BF16 in: the bundle stores the same bits (uint16, meta values "bfloat16"), and back to
    safetensors it is BF16 again, bit for bit; --dtype float32 widens it (exactly), --dtype
    bfloat16 rounds a float32 network as torch rounds; a run reads it widened and saves its
    float32 master weights, saying it trained in bfloat16."""
    from safetensors.torch import load_file

    from tests.helpers import run_cli

    torch = import_torch()
    tensors = _bf16_safetensors(tmp_path / "bf16.safetensors", torch)
    assert run_cli("convert", "safetensors", tmp_path / "bf16.safetensors", "--activations",
                   "relu", "-o", tmp_path / "net.npz").returncode == 0
    with np.load(tmp_path / "net.npz") as z:
        assert z["W1_data"].dtype == np.uint16 and z["b1"].dtype == np.uint16
        assert '"values": "bfloat16"' in str(z["meta"])
        bias_bits = tensors["fc1.bias"].view(torch.int16).numpy().view(np.uint16)
        np.testing.assert_array_equal(z["b1"], bias_bits)
    assert run_cli("convert", "network", tmp_path / "net.npz", "--to", "safetensors", "-o",
                   tmp_path / "back.safetensors").returncode == 0
    back = load_file(str(tmp_path / "back.safetensors"))
    for name, t in tensors.items():
        assert back[name].dtype == torch.bfloat16 and torch.equal(back[name], t), name
    assert run_cli("convert", "network", tmp_path / "net.npz", "--dtype", "float32", "-o",
                   tmp_path / "f32.npz").returncode == 0
    wide = load_network(tmp_path / "f32.npz")
    assert wide.dtype == np.float32 and "values" not in wide.meta()
    np.testing.assert_array_equal(wide.layers[0].weight.toarray(),
                                  tensors["fc1.weight"].float().numpy())
    f32 = tmp_path / "f32.safetensors"
    torch_f32 = {k: v.float() + 1e-3 for k, v in tensors.items()}  # not bfloat16 values
    from safetensors.torch import save_file
    save_file(torch_f32, str(f32))
    assert run_cli("convert", "safetensors", f32, "--activations", "relu", "--dtype",
                   "bfloat16", "-o", tmp_path / "rounded.npz").returncode == 0
    with np.load(tmp_path / "rounded.npz") as z:
        expected = torch_f32["fc1.bias"].to(torch.bfloat16).view(torch.int16).numpy()
        np.testing.assert_array_equal(z["b1"], expected.view(np.uint16))
    net = load_network(tmp_path / "net.npz")
    trained = _runtime_train_saved(net, tmp_path / "trained.npz")
    with np.load(trained) as z:
        assert z["W1_data"].dtype == np.float32
        assert '"trained_dtype": "bfloat16"' in str(z["meta"]) and '"values"' not in str(
            z["meta"])


def _runtime_train_saved(net, path):  # noqa: ANN001, ANN202
    """One epoch of ``net`` in bfloat16 on random data, saved to ``path`` (one process)."""
    from spdnn.comm.mpi import Communicator
    from spdnn.runtime.session import open_network, save_trained
    from spdnn.runtime.training import TrainConfig, train

    comm = Communicator.self_only()
    run = open_network(comm, net, None, "bfloat16")
    rng = np.random.default_rng(0)
    data = Dataset(name="t", x_train=rng.standard_normal((20, net.sizes[0])).astype(np.float32),
                   y_train=rng.integers(0, net.sizes[-1], 20))
    train(comm, run.dnet, data, TrainConfig(epochs=1, batch_size=8, optimizer=SGDConfig(0.1)))
    save_trained(comm, run.dnet, str(path), {})
    run.dnet.grid.free()
    return path


def test_a_bundle_whose_members_are_not_what_its_meta_says_is_refused(tmp_path):
    from spdnn.io.bundle import NetworkBundle, save_network

    net = small_network((8, 6, 4), dtype="float32")
    save_network(net, tmp_path / "f32.npz")
    with np.load(tmp_path / "f32.npz") as z:
        members = dict(z)
    members["meta"] = np.array(str(members["meta"]).replace('"cap"', '"values": "bfloat16", '
                                                                      '"cap"'))
    np.savez(tmp_path / "claims.npz", **members)
    with pytest.raises(InputError, match="claims.npz: layer 1: data must be bfloat16 bits"):
        NetworkBundle(tmp_path / "claims.npz")
    members["meta"] = np.array(str(members["meta"]).replace('"bfloat16"', '"float8"'))
    np.savez(tmp_path / "float8.npz", **members)
    with pytest.raises(InputError, match="float8.npz: meta: values 'float8' is not a stored"):
        NetworkBundle(tmp_path / "float8.npz")
    big = small_network((8, 6, 4), dtype="float32")
    big.layers[0].weight.data[0] = 3.4e38
    from spdnn.io.bundle import as_bfloat16
    with pytest.raises(ValueError, match="beyond bfloat16's range"):
        as_bfloat16(big)
