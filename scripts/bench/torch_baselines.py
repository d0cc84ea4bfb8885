"""PyTorch formulations of one SGD step of a sparse network, for the benchmarks only (torch is not
a dependency of spdnn: `pip install torch==2.13.0`).

Activations are (neurons x batch), as in spdnn, so a layer's product is a gather of rows.

- ``embedding_bag``: what a PyTorch user who cares about speed writes. A custom autograd function
  whose forward is ``F.embedding_bag(cols, X, offsets, per_sample_weights=values, mode="sum")``
  (fbgemm's sparse x dense kernel), whose input gradient is the same call on the transposed
  pattern (values gathered through a fixed permutation), and whose weight gradient is
  ``torch.sparse.sampled_addmm`` on the pattern.
- ``csr``: ``torch.sparse.mm`` on a CSR tensor for W X and W^T G (the transposed CSR kept
  beside it), ``sampled_addmm`` for the weight gradient.
- ``coo (naive)``: a COO tensor rebuilt from a Parameter every step, autograd through
  ``torch.sparse.mm`` (what bench_train.py used to compare against).
- ``sparseprop``: SparseProp (`pip install sparseprop`, ICML'23, float32 only), as its authors
  ship it: its ``SparseLinearFunction`` on activations of batch x neurons (it transposes to
  neurons x batch inside, for its vectorized kernels), the bias added after it.

A dense layer (every entry stored, e.g. the 10-way head) is a dense ``torch.mm`` in every
variant except the naive one. ``check`` compares each variant's gradients with spdnn's serial
reference in float64 before anything is timed.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

VARIANTS = ("embedding_bag", "csr", "coo (naive)", "sparseprop")


def available() -> tuple[str, ...]:
    """The variants this Python can run (SparseProp is a package of its own)."""
    import importlib.util

    return tuple(v for v in VARIANTS if v != "sparseprop"
                 or importlib.util.find_spec("sparseprop") is not None)


def _torch():  # noqa: ANN202
    import torch

    return torch


class _Pattern:
    """One layer's fixed pattern in the forms the variants need."""

    def __init__(self, w: sp.csr_matrix) -> None:
        torch = _torch()
        self.shape = w.shape
        self.dense = w.nnz == w.shape[0] * w.shape[1]
        w = w.tocsr()
        w.sort_indices()
        t = w.T.tocsr()  # positions of W's entries in W^T's order
        order = sp.csr_matrix((np.arange(w.nnz) + 1.0, w.indices, w.indptr), shape=w.shape)
        self.perm_t = torch.from_numpy(order.T.tocsr().data.astype(np.int64) - 1)
        as_long = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))  # noqa: E731
        self.cols, self.offsets = as_long(w.indices), as_long(w.indptr[:-1])
        self.cols_t, self.offsets_t = as_long(t.indices), as_long(t.indptr[:-1])
        self.indptr, self.indptr_t = as_long(w.indptr), as_long(t.indptr)
        self.ones = torch.ones(w.nnz, dtype=torch.float64 if w.dtype == np.float64
                               else torch.float32)
        coo = w.tocoo()
        self.coo_index = torch.from_numpy(np.vstack([coo.row, coo.col]).astype(np.int64))
        self.csr32 = (torch.from_numpy(w.indptr.astype(np.int32)),
                      torch.from_numpy(w.indices.astype(np.int32)))

    def sampled(self, d, x):  # noqa: ANN001, ANN201
        """dW[e] = d[i_e] . x[j_e] on the pattern."""
        torch = _torch()
        pattern = torch.sparse_csr_tensor(self.indptr, self.cols, self.ones.to(d.dtype),
                                          size=self.shape)
        return torch.sparse.sampled_addmm(pattern, d, x.t(), beta=0.0).values()


def _sparse_linear(product):  # noqa: ANN001, ANN202
    """An autograd function Y = W X on a fixed pattern, with ``product(pat, values, x,
    transposed)`` for W X and W^T G and sampled_addmm for the weight gradient."""
    torch = _torch()

    class SparseLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, values, pat):  # noqa: ANN001, ANN205
            ctx.save_for_backward(x, values)
            ctx.pat = pat
            return product(pat, values, x, False)

        @staticmethod
        def backward(ctx, g):  # noqa: ANN001, ANN205
            x, values = ctx.saved_tensors
            pat = ctx.pat
            gx = product(pat, values[pat.perm_t], g, True) if ctx.needs_input_grad[0] else None
            return gx, pat.sampled(g.contiguous(), x), None

    return SparseLinear.apply


def _embedding_bag(pat, values, x, transposed):  # noqa: ANN001, ANN202
    cols, offsets = (pat.cols_t, pat.offsets_t) if transposed else (pat.cols, pat.offsets)
    return _torch().nn.functional.embedding_bag(cols, x, offsets, per_sample_weights=values,
                                                mode="sum")


def _csr(pat, values, x, transposed):  # noqa: ANN001, ANN202
    torch = _torch()
    indptr, cols, shape = ((pat.indptr_t, pat.cols_t, pat.shape[::-1]) if transposed
                           else (pat.indptr, pat.cols, pat.shape))
    return torch.sparse.mm(torch.sparse_csr_tensor(indptr, cols, values, size=shape), x)


class TorchNet:
    """A spdnn Network as PyTorch parameters, trained by ``torch.optim.SGD``."""

    def __init__(self, net, variant: str, lr: float = 0.01, momentum: float = 0.9,  # noqa: ANN001
                 grad_only: bool = False) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}")
        torch = _torch()
        self.variant, self.cap = variant, net.cap
        self.patterns = [_Pattern(layer.weight) for layer in net.layers]
        self.values = [torch.nn.Parameter(torch.from_numpy(layer.weight.data.copy()))
                       for layer in net.layers]
        self.biases = [torch.nn.Parameter(torch.from_numpy(layer.bias.copy()))
                       for layer in net.layers]
        params = [p for pair in zip(self.values, self.biases) for p in pair]
        self.opt = None if grad_only else torch.optim.SGD(params, lr=lr, momentum=momentum)
        self.apply = {"embedding_bag": _sparse_linear(_embedding_bag),
                      "csr": _sparse_linear(_csr)}.get(variant)

    def _layer(self, k: int, h):  # noqa: ANN001, ANN202
        torch = _torch()
        pat, values = self.patterns[k], self.values[k]
        if self.variant == "sparseprop":  # h: batch x neurons, as SparseProp takes it
            if pat.dense:
                return h @ values.view(pat.shape).t()
            from sparseprop.modules.functions import SparseLinearFunction

            return SparseLinearFunction.apply(h, values, pat.csr32, None, pat.shape[0])
        if self.variant == "coo (naive)":
            w = torch.sparse_coo_tensor(pat.coo_index, values, pat.shape, is_coalesced=True)
            return torch.sparse.mm(w, h)
        if pat.dense:
            return values.view(pat.shape) @ h
        return self.apply(h, values, pat)

    def loss(self, x, y):  # noqa: ANN001, ANN201
        """Mean cross-entropy of a batch (x: samples x n_0 numpy, y: labels)."""
        torch = _torch()
        rows = self.variant == "sparseprop"  # samples x neurons; the others neurons x samples
        h = torch.from_numpy(np.ascontiguousarray(x if rows else x.T))
        for k in range(len(self.patterns)):
            h = self._layer(k, h) + (self.biases[k] if rows else self.biases[k][:, None])
            if k + 1 < len(self.patterns):
                h = torch.relu(h) if self.cap is None else torch.clamp(h, 0, self.cap)
        return torch.nn.functional.cross_entropy(h if rows else h.t(), torch.from_numpy(y))

    def step(self, x, y) -> float:  # noqa: ANN001
        loss = self.loss(x, y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return float(loss)

    def gradients(self, x, y) -> tuple[list[np.ndarray], list[np.ndarray], float]:  # noqa: ANN001
        for p in self.values + self.biases:
            p.grad = None
        loss = self.loss(x, y)
        loss.backward()
        return ([v.grad.numpy().copy() for v in self.values],
                [b.grad.numpy().copy() for b in self.biases], float(loss))


def check(variant: str, seed: int = 0) -> float:
    """Largest relative difference between the variant's gradients and spdnn's serial
    reference on a small network with a dense head; raises if above 1e-10 in float64 (1e-4 in
    float32 for SparseProp, which has no float64 kernels)."""
    from spdnn import reference
    from spdnn.model.generate import random_network

    dtype, limit = ("float32", 1e-4) if variant == "sparseprop" else ("float64", 1e-10)
    net = random_network([64, 96, 80, 48], 8, seed=seed, head=10, dtype=dtype)
    rng = np.random.default_rng(seed)
    # Nonzero biases and inputs, so that some units are off and the masks matter.
    for layer in net.layers:
        layer.bias[:] = rng.standard_normal(len(layer.bias)) * 0.1
    x = rng.standard_normal((33, 64)).astype(dtype)
    y = rng.integers(0, 10, 33)
    ref = reference.backward(net, x.T.copy(), y, "cross_entropy")
    gw, gb, loss = TorchNet(net, variant, grad_only=True).gradients(x, y)
    worst = abs(loss - ref.loss) / abs(ref.loss)
    for a, b in zip(gw + gb, ref.weights + ref.biases):
        worst = max(worst, float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)))
    if not worst <= limit:
        raise AssertionError(f"PyTorch variant {variant!r} differs from the serial reference "
                             f"by {worst:.2e}")
    return worst
