"""LSH-selected output neurons (``--lsh``, SLIDE) on every grid equal the serial reference of
the same sampled algorithm (the same active sets: the same count of active pairs, losses and
weights within 1e-10); a resumed run equals the uninterrupted one. Run under mpiexec -n 1, 2,
3 and 4."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from spdnn.io.loaders import load_dataset
from spdnn.kernels.lsh import parse_lsh
from spdnn.reference import train as reference_train
from spdnn.runtime.checkpoint import load_checkpoint
from spdnn.runtime.lsh_layer import use_lsh
from spdnn.runtime.training import TrainConfig, train
from tests.helpers import small_network
from tests.test_replicas_mpi import SGD, _digest, _open, grids, trains_as_the_reference

pytestmark = pytest.mark.mpi
SAMPLE = Path(__file__).resolve().parents[1] / "data" / "xc-sample"
# The same active sets: the same count of active pairs, and so the same P@5 and accuracy.
SAMPLED_FIELDS = ("active_outputs", "train_accuracy", "precision_at_5")


@pytest.mark.parametrize("spec", ["2:3:6:dwta", "2:5:6:simhash", "2:2:6:simhash:cap 7",
                                  "2:4:6:dwta:random 20", "2:2:6:simhash:cap 7:top 9",
                                  "2:3:6:simhash:random 12:top 5:tail"])
@pytest.mark.parametrize("method", ["block", "hypergraph"])
def test_sampled_training_on_every_grid_equals_the_serial_reference(comm, mpi_tmp_path, spec,
                                                                   method):
    data = load_dataset(f"xc:{SAMPLE}", "float64")
    # a sparse output layer (fan-in 24 of 40): ranks hash a gathered input vector
    net = small_network((256, 40, 128), fan_in=24, seed=5, bias_scale=0.1)
    tail = spec.endswith(":tail")  # the random neurons stand for the rest
    spec, _, top = spec.removesuffix(":tail").partition(":top ")
    text, _, cap = spec.partition(":cap ")
    text, _, fill = text.partition(":random ")
    lsh = parse_lsh(text, int(cap) if cap else None, int(fill) if fill else 0,
                    int(top) if top else 0, tail)
    cfg = TrainConfig(epochs=2, batch_size=64, optimizer=SGD, seed=3, max_steps=14, lsh=lsh,
                      rehash=3)
    expected, ref = reference_train(net, data, 2, 64, SGD, seed=3, max_steps=14, lsh=lsh,
                                    rehash=3)
    # the cap: 7 + the labels (+ the top-bias neurons, which join besides)
    assert 0 < ref[0].active_outputs < (10 + int(top or 0) if cap else 128)
    if fill or top:  # the random or top-bias neurons join the retrieved ones
        assert ref[0].active_outputs > 15
    trains_as_the_reference(comm, mpi_tmp_path, net, data, cfg, expected, ref, method=method,
                            name="lsh", same=SAMPLED_FIELDS)


@pytest.mark.parametrize("spec", ["1:3:6:simhash", "1:2:8:dwta", "2:4:6:simhash:cap 9"])
def test_a_sampled_hidden_layer_on_every_grid_equals_the_serial_reference(comm, mpi_tmp_path,
                                                                          spec):
    """``--lsh`` on a hidden layer: its neurons active for the buckets that a sample's input
    hits (zero activation elsewhere), the layers above exact; the gradients of its active
    rows only. Layer 1 hashes the samples themselves, layer 2 the first layer's output
    (gathered from its owners where a rank's rows read only part of it)."""
    data = load_dataset(f"xc:{SAMPLE}", "float64")
    net = small_network((256, 48, 40, 128), fan_in=24, seed=8, bias_scale=0.1)
    text, _, cap = spec.partition(":cap ")
    lsh = parse_lsh(text, int(cap) if cap else None)
    cfg = TrainConfig(epochs=2, batch_size=64, optimizer=SGD, seed=3, max_steps=10, lsh=lsh,
                      rehash=3)
    expected, ref = reference_train(net, data, 2, 64, SGD, seed=3, max_steps=10, lsh=lsh,
                                    rehash=3)
    width = net.sizes[lsh.layer]
    assert 0 < ref[0].active_outputs < (int(cap) if cap else width)  # a sample uses a few
    trains_as_the_reference(comm, mpi_tmp_path, net, data, cfg, expected, ref, name="lsh-h",
                            same=SAMPLED_FIELDS)


@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
def test_a_sampled_hidden_layer_under_single_labels_and_either_loss(comm, mpi_tmp_path, loss):
    """Above a sampled hidden layer the network's own loss applies (not the sampled softmax of
    an LSH output layer): single-label digits, mse or cross-entropy, on every grid."""
    data = load_dataset("digits", "float64")
    net = small_network((64, 48, 40, 10), fan_in=24, seed=8, bias_scale=0.1)
    lsh = parse_lsh("1:3:6:simhash")
    cfg = TrainConfig(epochs=2, batch_size=64, optimizer=SGD, seed=3, max_steps=10, lsh=lsh,
                      rehash=3, loss=loss)
    expected, ref = reference_train(net, data, 2, 64, SGD, seed=3, max_steps=10, lsh=lsh,
                                    rehash=3, loss=loss)
    assert 0 < ref[0].active_outputs < 48
    trains_as_the_reference(comm, mpi_tmp_path, net, data, cfg, expected, ref, name="lsh-m",
                            same=("active_outputs", "train_accuracy", "test_accuracy"))


def test_sampled_training_resumes_exactly(comm, mpi_tmp_path):
    data = load_dataset(f"xc:{SAMPLE}", "float64")
    net = small_network((256, 40, 128), fan_in=40, seed=6, bias_scale=0.1)
    grid = grids(comm.size)[-1]  # the most replicas
    full = TrainConfig(epochs=2, batch_size=64, optimizer=SGD, seed=5, lsh=parse_lsh("2:4:5"),
                       rehash=2)
    ckpt = str(mpi_tmp_path / "ckpt-lsh")
    whole = _open(comm, mpi_tmp_path, net, *grid, name="lsh-r").dnet
    expected = train(comm, whole, data, replace(full, checkpoint_dir=str(mpi_tmp_path / "w"),
                                                checkpoint_every=4))
    first = _open(comm, mpi_tmp_path, net, *grid, name="lsh-r").dnet
    train(comm, first, data, replace(full, max_steps=4, checkpoint_dir=ckpt,
                                     checkpoint_every=4))
    resumed = _open(comm, mpi_tmp_path, net, *grid, name="lsh-r").dnet
    position, momentum = load_checkpoint(resumed, ckpt, full.settings())
    assert position.step == 4
    reports = train(comm, resumed, data, replace(full, checkpoint_dir=ckpt, checkpoint_every=4),
                    position, momentum)
    assert reports[-1].loss == expected[-1].loss
    assert _digest(resumed) == _digest(whole)
    for d in (whole, first, resumed):
        d.grid.free()


def _retrieved_top5(net, x, hashes):
    """The 5 best retrieved outputs per sample, computed plainly from the whole network."""
    from spdnn.model.batching import columns
    from spdnn.reference import forward, lsh_tables

    _, xs = forward(net, columns(x, slice(None)))
    h, w = xs[-1], net.layers[-1].weight
    none = np.zeros(0, np.int64)
    ptr, act, _, _ = lsh_tables(net, hashes).retrieve(hashes.codes_of_columns(h),
                                                     net.sizes[-1], none, none, np.zeros(0))
    top = np.full((h.shape[1], 5), -1)
    for s in range(h.shape[1]):
        rows = act[ptr[s]:ptr[s + 1]]
        z = w[rows] @ h[:, s] + net.layers[-1].bias[rows]
        best = rows[np.lexsort((rows, -z))][:5]
        top[s, :len(best)] = best
    return top


@pytest.mark.parametrize("spec", ["2:2:6:dwta", "2:3:5:simhash", "2:8:2:simhash"])
def test_inference_among_retrieved_outputs_on_every_grid(comm, mpi_tmp_path, spec):
    from spdnn.kernels.hashing import HashFunctions
    from spdnn.model.labels import precision_at

    data = load_dataset(f"xc:{SAMPLE}", "float64")
    net = small_network((256, 40, 128), fan_in=24, seed=7, bias_scale=0.1)
    lsh = parse_lsh(spec)
    top = _retrieved_top5(net, data.x_test, HashFunctions.make(lsh, 40, 0))
    assert (top[:, 0] >= 0).any()
    if spec == "2:8:2:simhash":  # few buckets hit: samples with fewer than 5 count misses
        assert (top == -1).any()
    expected = (precision_at(data.y_test, top, 1), precision_at(data.y_test, top, 5))
    _sampled_precisions_on_every_grid(comm, mpi_tmp_path, net, lsh, data, expected, "lsh-i")


def test_inference_with_a_sampled_hidden_layer_on_every_grid(comm, mpi_tmp_path):
    """``infer --lsh`` on a hidden layer: its retrieved neurons only, then every output."""
    from spdnn.kernels.hashing import HashFunctions
    from spdnn.model.batching import columns
    from spdnn.model.labels import precision_at
    from spdnn.model.ops import output, top_k
    from spdnn.reference import HiddenSampler, forward, lsh_tables

    data = load_dataset(f"xc:{SAMPLE}", "float64")
    net = small_network((256, 48, 40, 128), fan_in=24, seed=9, bias_scale=0.1)
    lsh = parse_lsh("1:3:6:simhash")
    hashes = HashFunctions.make(lsh, 256, 0)
    sampler = HiddenSampler(hashes, lsh_tables(net, hashes))
    zs, _ = forward(net, columns(data.x_test, slice(None)), sampler)
    top = top_k(output(zs[-1], net.output_function), 5)
    expected = (precision_at(data.y_test, top, 1), precision_at(data.y_test, top, 5))
    active = np.count_nonzero(zs[0]) / zs[0].shape[1]
    assert 0 < active < 0.8 * 48  # a sample computes some of the layer's neurons
    _sampled_precisions_on_every_grid(comm, mpi_tmp_path, net, lsh, data, expected, "lsh-hi")


def _sampled_precisions_on_every_grid(comm, tmp, net, lsh, data, expected, name):
    """P@1 and P@5 of ``precisions(..., sampled=True)`` equal ``expected`` on every grid."""
    from spdnn.runtime.inference import local_inputs, precisions

    for parts, replicas in grids(comm.size):
        dnet = _open(comm, tmp, net, parts, replicas, name=name).dnet
        use_lsh(dnet, lsh, 0)
        dnet.sampled.rebuild()
        got = precisions(dnet, local_inputs(dnet, data.x_test, "x"), data.y_test,
                         batch_size=37, sampled=True)
        assert got == pytest.approx(expected, abs=1e-12)
        dnet.grid.free()
