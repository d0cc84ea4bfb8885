"""The activations (spdnn.model.activations) against torch.nn itself: each value and derivative
on the same arrays, and whole training runs of the serial reference against torch on the same
masked network with one activation per layer (float64, batches in file order). torch is
installed by the test command."""

from __future__ import annotations

import numpy as np
import pytest

from spdnn.io.loaders import Dataset
from spdnn.model.activations import ACTIVATIONS, parse, parse_list
from spdnn.optim import AdamWConfig, SGDConfig
from spdnn.reference import train
from tests.helpers import (
    LazyTorch,
    assert_one_line_error,
    import_torch,
    lazy_torch,
    run_spdnn,
    small_network,
)
from tests.test_optim import _assert_same_weights, _torch_train

torch = lazy_torch  # imported where a test uses it
nn = LazyTorch("nn")

# Each activation as spdnn writes it, and the torch module that computes the same.
TORCH = {
    "relu": lambda: nn.ReLU(),
    "relu-capped": lambda: nn.Hardtanh(0.0, 1.5),
    "leaky_relu": lambda: nn.LeakyReLU(),
    "leaky_relu:-0.4": lambda: nn.LeakyReLU(-0.4),
    "tanh": lambda: nn.Tanh(),
    "sigmoid": lambda: nn.Sigmoid(),
    "gelu": lambda: nn.GELU(),
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "identity": lambda: nn.Identity(),
}


def _ours(case):
    return parse("relu", cap=1.5) if case == "relu-capped" else parse(case)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", sorted(TORCH))
def test_each_value_and_derivative_is_torchs(case, dtype):
    """On values around every kink (0 and the cap exactly, +-1e-300, large of both signs):
    h(z) and g * h'(z) within a few units in the last place of torch's (float64: 1e-13
    relative, 1e-14 absolute where 1 + tanh cancels)."""
    rng = np.random.default_rng(0)
    z = np.concatenate([rng.standard_normal(500) * 3, [0.0, -0.0, 1.5, -1.5, 1e-300, -1e-300,
                                                     40.0, -40.0, 8.0, -8.0]]).astype(dtype)
    g = rng.standard_normal(len(z)).astype(dtype)
    act = _ours(case)
    zt = torch.tensor(z, requires_grad=True)
    ht = TORCH[case]()(zt)
    ht.backward(torch.tensor(g))
    rtol, atol = (1e-13, 1e-14) if dtype == np.float64 else (1e-5, 1e-5)
    h = act.apply(z)
    assert h.dtype == dtype
    np.testing.assert_allclose(h, ht.detach().numpy(), rtol=rtol, atol=atol)
    for from_output in (None, h):
        grad = g.copy()
        act.backward(grad, z, from_output)
        np.testing.assert_allclose(grad, zt.grad.numpy(), rtol=rtol, atol=atol)
    assert act.zeros == (act.name == "relu")


def _masked_model(net, modules):
    import_torch()  # skips (fails under CI) without torch
    from torch.nn.utils import prune

    layers = []
    for k, layer in enumerate(net.layers):
        lin = nn.Linear(layer.n_in, layer.n_out, dtype=torch.float64)
        with torch.no_grad():
            lin.weight.copy_(torch.tensor(layer.weight.toarray()))
            lin.bias.copy_(torch.tensor(layer.bias))
        prune.custom_from_mask(lin, "weight", torch.tensor(layer.weight.toarray() != 0))
        layers.append(lin)
        if k < net.n_layers - 1:
            layers.append(modules[k]())
    return nn.Sequential(*layers)


MIXES = {
    "tanh-sigmoid-gelu": ("tanh", "sigmoid", "gelu"),
    "leaky-gelu_tanh-identity": ("leaky_relu:-0.4", "gelu_tanh", "identity"),
    "relu-capped-tanh-leaky": ("relu-capped", "tanh", "leaky_relu"),
}


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
@pytest.mark.parametrize("mix", sorted(MIXES))
def test_training_equals_torch_with_an_activation_per_layer(mix, opt_name):
    """Two epochs of the serial reference and of torch (prune masks, batches in file order,
    the last one smaller), a different activation on every hidden layer: the same weights
    within 1e-9."""
    cases = MIXES[mix]
    specs = tuple("relu" if c == "relu-capped" else c for c in cases)
    cap = 1.5 if "relu-capped" in cases else None
    net = small_network((12, 16, 14, 10, 5), fan_in=4, seed=3, bias_scale=0.5, cap=cap,
                        activations=specs)
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((30, 12)) * 2, rng.integers(0, 5, 30)
    config, name, kwargs = {
        "sgd": (SGDConfig(0.2, 0.9), "SGD", dict(lr=0.2, momentum=0.9)),
        "adamw": (AdamWConfig(lr=0.02), "AdamW", dict(lr=0.02)),
    }[opt_name]
    trained, _ = train(net, Dataset(name="t", x_train=x, y_train=y), 2, 8, config,
                       shuffle=False)
    model = _masked_model(net, [TORCH[c] for c in cases])
    linears = _torch_train(model, x, y, name, kwargs, 2, 8)
    _assert_same_weights(trained, linears)
    assert np.abs(trained.layers[0].weight.data - net.layers[0].weight.data).max() > 1e-3


def test_activations_are_named_or_refused_in_one_line():
    assert [parse(a).spec for a in ACTIVATIONS] == [
        "relu", "leaky_relu:0.01", "tanh", "sigmoid", "gelu", "gelu_tanh", "identity"]
    assert parse("leaky_relu:-2").slope == -2.0
    assert parse_list("tanh", 3) == (parse("tanh"),) * 3
    for bad, fragment in (("swish", "unknown activation 'swish'; choose from relu, leaky_relu"),
                          ("tanh:2", "only leaky_relu takes a parameter"),
                          ("leaky_relu:nan", "the slope must be finite"),
                          ("leaky_relu:x", "the slope must be a number")):
        with pytest.raises(ValueError, match=fragment):
            parse(bad)
    with pytest.raises(ValueError, match="2 activations for 3 hidden layers"):
        parse_list("tanh,relu", 3)
    with pytest.raises(ValueError, match="unknown activation"):
        small_network(activations=("relu", "soft"))


def test_generate_writes_a_network_with_the_activations_asked_for(tmp_path):
    """``spdnn generate random --activations``: one for all hidden layers or one per layer, kept
    in the bundle; a wrong count or name is one line, nothing written."""
    from spdnn.io.bundle import load_network

    proc = run_spdnn("generate", "random", "--sizes", "12,10,8,4", "--fan-in", "3",
                     "--activations", "tanh,gelu", "-o", tmp_path / "net.npz")
    assert proc.returncode == 0, proc.stderr
    assert load_network(tmp_path / "net.npz").activations == ("tanh", "gelu")
    for bad, fragment in (("tanh", None), ("tanh,relu,relu", "3 activations for 2"),
                          ("swish", "unknown activation 'swish'")):
        proc = run_spdnn("generate", "random", "--sizes", "12,10,8,4", "--fan-in", "3",
                         "--activations", bad, "-o", tmp_path / "bad.npz")
        if fragment is None:
            assert proc.returncode == 0, proc.stderr
            assert load_network(tmp_path / "bad.npz").activations == ("tanh", "tanh")
            (tmp_path / "bad.npz").unlink()
            continue
        assert_one_line_error(proc, "--activations", fragment)
        assert not (tmp_path / "bad.npz").exists()


def test_what_needs_relus_zeros_refuses_other_activations_in_one_line(tmp_path):
    """Graph Challenge inference (its categories are a ReLU network's nonzero outputs) and a
    sampled hidden layer (the neurons LSH leaves out must give exact zeros) take ReLU; a
    tanh network is refused by name, in one line, nothing written."""
    from spdnn.io.bundle import save_network

    net = small_network((6, 8, 5, 4), fan_in=3, activations=("tanh", "relu"),
                        output_activation="relu")
    save_network(net, tmp_path / "tanh.npz")
    (tmp_path / "images.tsv").write_text("1\t1\t1\n2\t3\t1\n")
    proc = run_spdnn("infer", "--network", tmp_path / "tanh.npz", "--inputs",
                     tmp_path / "images.tsv", "--categories-out", tmp_path / "cats.tsv")
    assert_one_line_error(proc, "tanh.npz", "Graph Challenge inference runs ReLU networks",
                          "computes tanh")
    assert not (tmp_path / "cats.tsv").exists()
    from spdnn.errors import SpdnnError
    from spdnn.kernels.lsh import check_lsh_layer, parse_lsh

    with pytest.raises(SpdnnError, match="layer 1 computes tanh; a sampled hidden layer is ReLU"):
        check_lsh_layer(parse_lsh("1:2:2"), net.sizes, activations=net.activations)
    check_lsh_layer(parse_lsh("2:2:2"), net.sizes, activations=net.activations)


def test_float32_gelu_is_as_close_to_the_exact_value_as_torchs(backend):
    """In float32 the numba backend's GELU takes Abramowitz and Stegun's erf around numpy's
    exp (spdnn.kernels._numba_activations): against the exact value (float64 erf), its error
    is within half a float32 spacing of torch's own float32 GELU's (counted in spacings of
    max(|value|, 1): torch's vectorised erf differs by CPU, by a spacing or so); its slope
    too."""
    import scipy.special

    from spdnn.kernels import products as kernels

    z = (np.random.default_rng(2).standard_normal((64, 500)) * 4).astype(np.float32)
    z[0, :3] = [0, 9, -9]
    z64 = z.astype(np.float64)
    exact = z64 * 0.5 * (1 + scipy.special.erf(z64 * np.sqrt(0.5)))
    ours = np.empty_like(z)
    kernels.activate(parse("gelu"), z, ours)
    zt = torch.tensor(z, requires_grad=True)
    theirs = torch.nn.functional.gelu(zt)
    theirs.backward(torch.ones_like(zt))
    spacing = np.spacing(np.maximum(np.abs(exact), 1).astype(np.float32)).astype(np.float64)
    err = np.abs(ours - exact)
    torch_err = np.abs(theirs.detach().numpy() - exact)
    assert (err / spacing).max() <= (torch_err / spacing).max() + 0.5 and err.max() < 1e-6
    slope_exact = 0.5 * (1 + scipy.special.erf(z64 * np.sqrt(0.5))) + z64 * np.exp(
        -0.5 * z64 ** 2) / np.sqrt(2 * np.pi)
    g = np.ones_like(z)
    kernels.activation_backward(parse("gelu"), g, z, ours)
    assert np.abs(g - slope_exact).max() <= max(
        np.abs(zt.grad.numpy() - slope_exact).max(), 1e-6)


def test_a_checkpoint_resumes_only_on_the_network_it_was_written_for(tmp_path):
    """The activations, the cap and the output activation are the network's (not options):
    a checkpoint of a ReLU network does not resume a tanh one of the same pattern, nor a
    capped one, even with --resume-with-changes."""
    from dataclasses import replace

    from spdnn.io.bundle import save_network
    from spdnn.model.generate import random_network

    relu = random_network([64, 24, 10], 8, seed=3)
    save_network(relu, tmp_path / "relu.npz")
    save_network(relu.with_activations("tanh"), tmp_path / "tanh.npz")
    save_network(replace(relu, cap=4.0), tmp_path / "capped.npz")
    save_network(replace(relu, output_activation="relu"), tmp_path / "out.npz")
    ckpt = tmp_path / "ckpt"
    common = ["train", "--data", "digits", "--epochs", "1", "--max-steps", "3"]
    proc = run_spdnn(*common, "--network", tmp_path / "relu.npz", "--checkpoint-dir", ckpt)
    assert proc.returncode == 0, proc.stderr
    for name, fragment in (("tanh", "activations relu, this network has tanh"),
                           ("capped", "cap none, this network has 4"),
                           ("out", "output_activation linear, this network has relu")):
        for extra in ([], ["--resume-with-changes"]):
            proc = run_spdnn(*common, "--network", tmp_path / f"{name}.npz", "--resume", ckpt,
                             *extra)
            assert_one_line_error(proc, "manifest.json", fragment)
    proc = run_spdnn(*common[:-1], "4", "--network", tmp_path / "relu.npz", "--resume", ckpt)
    assert proc.returncode == 0, proc.stderr


def test_relus_slope_is_torchs_at_zero_and_at_the_cap():
    """ReLU's slope (the serial reference's; the products fuse their own) is 0 at z = 0, and
    capped, 0 at and beyond the cap too: torch's relu and Hardtanh(0, cap) gradients."""
    from spdnn.model.activations import parse

    z = np.array([-1.0, 0.0, 0.5, 2.0, 3.0])
    assert parse("relu").slope_of(z).tolist() == [0, 0, 1, 1, 1]
    assert parse("relu", cap=2.0).slope_of(z).tolist() == [0, 0, 1, 0, 0]
    g = np.full(5, 3.0)
    parse("relu", cap=2.0).backward(g, z)
    assert g.tolist() == [0, 0, 3, 0, 0]
    assert parse("relu", cap=2.0).apply(z).tolist() == [0, 0, 0.5, 2, 2]
