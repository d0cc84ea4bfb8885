"""spdnn.from_torch and spdnn.to_torch against the real torch: the same model both ways,
outputs equal, prune masks in place, and what spdnn does not compute refused by name."""

from __future__ import annotations

import numpy as np
import pytest

import spdnn
from spdnn import reference
from spdnn.errors import SpdnnError
from tests.helpers import lazy_torch, small_network

torch = lazy_torch  # imported where a test uses it
nn = torch.nn
from torch.nn.utils import prune  # noqa: E402


def _pruned_mlp(dtype=torch.float64, cap=None):
    torch.manual_seed(0)
    act = (lambda: nn.ReLU()) if cap is None else (lambda: nn.Hardtanh(0.0, cap))
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 16, dtype=dtype), act(), nn.Dropout(0.2),
                          nn.Linear(16, 9, dtype=dtype), act(), nn.Identity(),
                          nn.Linear(9, 4, dtype=dtype))
    for m in model:
        if isinstance(m, nn.Linear):
            prune.random_unstructured(m, "weight", amount=0.6)
    return model.eval()


@pytest.mark.parametrize("cap", [None, 0.7])
def test_a_pruned_torch_model_computes_the_same_in_spdnn(cap):
    model = _pruned_mlp(cap=cap)
    net = spdnn.from_torch(model)
    assert tuple(net.sizes) == (12, 16, 9, 4) and net.dtype == np.float64 and net.cap == cap
    masks = [m.weight_mask for m in model if isinstance(m, nn.Linear)]
    assert [layer.weight.nnz for layer in net.layers] == [int(m.sum()) for m in masks]
    x = np.random.default_rng(1).standard_normal((20, 12))
    with torch.no_grad():
        theirs = model(torch.tensor(x)).numpy()
    np.testing.assert_allclose(reference.predict(net, x), theirs, rtol=0, atol=1e-12)


def test_to_torch_gives_the_network_back_with_its_masks_ready_to_fine_tune():
    net = small_network((12, 16, 9, 4), fan_in=4, seed=2, bias_scale=0.3)
    model = spdnn.to_torch(net)
    x = np.random.default_rng(3).standard_normal((10, 12))
    with torch.no_grad():
        out = model(torch.tensor(x)).numpy()
    np.testing.assert_allclose(out, reference.predict(net, x), rtol=0, atol=1e-12)
    lins = [m for m in model if isinstance(m, nn.Linear)]
    assert all(hasattr(m, "weight_orig") and hasattr(m, "weight_mask") for m in lins)
    assert [int(m.weight_mask.sum()) for m in lins] == [la.weight.nnz for la in net.layers]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.nn.functional.cross_entropy(model(torch.tensor(x)), torch.zeros(10, dtype=torch.long)
                                      ).backward()
    opt.step()
    again = spdnn.from_torch(model)  # still sparse on the same pattern after a torch step
    for a, b in zip(again.layers, net.layers):
        np.testing.assert_array_equal(a.weight.indices, b.weight.indices)
    back = spdnn.from_torch(spdnn.to_torch(net))
    for a, b in zip(back.layers, net.layers):
        np.testing.assert_array_equal(a.weight.data, b.weight.data)
        np.testing.assert_array_equal(a.bias, b.bias)


def test_every_activation_comes_across_both_ways():
    """Each hidden layer's own activation (a Linear with none between is identity): the same
    outputs in spdnn as in torch, and to_torch gives the same modules back."""
    torch.manual_seed(5)
    d = torch.float64
    model = nn.Sequential(nn.Linear(10, 14, dtype=d), nn.Tanh(), nn.Linear(14, 13, dtype=d),
                          nn.LeakyReLU(-0.25), nn.Linear(13, 12, dtype=d), nn.GELU(),
                          nn.Linear(12, 11, dtype=d), nn.GELU(approximate="tanh"),
                          nn.Linear(11, 10, dtype=d), nn.Sigmoid(), nn.Linear(10, 9, dtype=d),
                          nn.Linear(9, 8, dtype=d), nn.Hardtanh(0.0, 0.8),
                          nn.Linear(8, 4, dtype=d))
    for m in model:
        if isinstance(m, nn.Linear):
            prune.random_unstructured(m, "weight", amount=0.5)
    net = spdnn.from_torch(model)
    assert net.activations == ("tanh", "leaky_relu:-0.25", "gelu", "gelu_tanh", "sigmoid",
                               "identity", "relu") and net.cap == 0.8
    x = np.random.default_rng(6).standard_normal((25, 10)) * 3
    with torch.no_grad():
        theirs = model(torch.tensor(x)).numpy()
    np.testing.assert_allclose(reference.predict(net, x), theirs, rtol=0, atol=1e-12)
    back = spdnn.to_torch(net)
    kinds = [type(m).__name__ for m in back if not isinstance(m, nn.Linear)]
    assert kinds == ["Tanh", "LeakyReLU", "GELU", "GELU", "Sigmoid", "Identity", "Hardtanh"]
    with torch.no_grad():
        np.testing.assert_allclose(back(torch.tensor(x)).numpy(), theirs, rtol=0, atol=1e-12)


@pytest.mark.parametrize("module, fragment", [
    (nn.Sequential(nn.Linear(4, 3), nn.Softplus(), nn.Linear(3, 2)), "module '1' (Softplus)"),
    (nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 2)),
     "module '1' (BatchNorm1d)"),
    (nn.Sequential(nn.Conv1d(1, 2, 3)), "module '0' (Conv1d)"),
    (nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.ReLU(), nn.Linear(3, 2)),
     "one activation follows each Linear"),
    (nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2), nn.Tanh()),
     "the output layer is linear"),
    (nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(2, 2)), "takes 2 inputs but '0'"),
])
def test_what_spdnn_does_not_compute_is_refused_by_name(module, fragment):
    with pytest.raises(SpdnnError) as err:
        spdnn.from_torch(module)
    assert fragment in str(err.value)
    if "not supported: spdnn takes" in str(err.value):
        assert "Linear, ReLU" in str(err.value)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        spdnn.from_torch("model.pt")


def test_weight_origs_values_outside_the_mask_come_back(tmp_path):
    """A pruned module keeps weight_orig's values where the mask is 0 (torch's
    prune.random_unstructured leaves them): from_torch keeps them, a bundle and a pruned
    safetensors file store them, and to_torch and the export put them back; a plain export
    writes the masked weight (zeros there)."""
    from spdnn.io.safetensors import read_safetensors, write_safetensors

    model = _pruned_mlp()
    net = spdnn.from_torch(model)
    lins = [m for m in model if isinstance(m, nn.Linear)]
    assert all(la.pruned is not None and np.any(la.pruned != 0) for la in net.layers)
    spdnn.save_network(net, tmp_path / "net.npz")
    write_safetensors(net, tmp_path / "net.safetensors", pruned=True)
    for again in (net, spdnn.load_network(tmp_path / "net.npz"),
                  read_safetensors(tmp_path / "net.safetensors", dtype=np.float64)):
        back = [m for m in spdnn.to_torch(again) if isinstance(m, nn.Linear)]
        for a, b in zip(back, lins):
            torch.testing.assert_close(a.weight_orig, b.weight_orig, rtol=0, atol=0)
            torch.testing.assert_close(a.weight_mask, b.weight_mask, rtol=0, atol=0)
    write_safetensors(net, tmp_path / "plain.safetensors", pruned=False)
    plain = read_safetensors(tmp_path / "plain.safetensors", dtype=np.float64)
    assert all(la.pruned is None for la in plain.layers)
    np.testing.assert_array_equal(plain.layers[0].weight.toarray(),
                                  (lins[0].weight_orig * lins[0].weight_mask).detach().numpy())
