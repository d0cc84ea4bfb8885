"""PyTorch interop through .safetensors: files in PyTorch's naming (written here byte by byte,
independently of spdnn's writer), round trips, damaged files, the CLI, and the real round trip
with torch when it is installed."""

import json
import struct

import numpy as np
import pytest

from spdnn import reference
from spdnn.errors import InputError
from spdnn.io.bundle import load_network
from spdnn.io.safetensors import read_safetensors, write_safetensors
from tests.helpers import assert_one_line_error, import_torch, run_spdnn

CODES = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.float16): "F16",
         np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL"}


def _write_raw(path, tensors, header_patch=None, data_cut=0):
    """A safetensors file from {name: array} (BF16 for ("bf16", float32 array))."""
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        if isinstance(a, tuple):  # bfloat16: the upper half of each float32
            raw = (np.asarray(a[1], np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
            code, shape = "BF16", list(np.shape(a[1]))
        else:
            raw, code, shape = a.tobytes(), CODES[a.dtype], list(a.shape)
        header[name] = {"dtype": code, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if header_patch:
        header_patch(header)
    head = json.dumps(header).encode()
    data = b"".join(blobs)
    path.write_bytes(struct.pack("<Q", len(head)) + head + data[:len(data) - data_cut])
    return path


def _mlp(rng, sizes=(12, 9, 7, 4), density=0.4):
    """Dense weights with zeros, PyTorch layout [out, in]."""
    ws, bs = [], []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        w = rng.standard_normal((n_out, n_in)).astype(np.float32)
        w[rng.random(w.shape) > density] = 0
        ws.append(w)
        bs.append(rng.standard_normal(n_out).astype(np.float32))
    return ws, bs


def _forward(ws, bs, x):
    """PyTorch's Linear/ReLU stack in numpy (x: samples x features)."""
    for k, (w, b) in enumerate(zip(ws, bs)):
        x = x @ w.T.astype(np.float64) + b
        if k < len(ws) - 1:
            x = np.maximum(x, 0)
    return x


def test_pruned_and_zero_styles_read_as_the_same_network(tmp_path):
    rng = np.random.default_rng(0)
    ws, bs = _mlp(rng)
    plain = {}
    pruned = {}
    for k, (w, b) in enumerate(zip(ws, bs), start=1):
        plain[f"fc{k}.weight"], plain[f"fc{k}.bias"] = w, b
        orig = np.where(w == 0, rng.standard_normal(w.shape), w).astype(np.float32)
        pruned[f"fc{k}.weight_orig"] = orig  # pruned-away values are still stored
        pruned[f"fc{k}.weight_mask"] = (w != 0).astype(np.float32)
        pruned[f"fc{k}.bias"] = b
    a = read_safetensors(_write_raw(tmp_path / "plain.safetensors", plain), dtype=np.float64,
                         activations="relu")
    b = read_safetensors(_write_raw(tmp_path / "pruned.safetensors", pruned), dtype=np.float64,
                         activations="relu")
    x = rng.standard_normal((5, 12))
    for net in (a, b):
        assert net.sizes == (12, 9, 7, 4) and net.output_activation == "linear"
        assert net.nnz == sum(int(np.count_nonzero(w)) for w in ws)
        out = reference.forward(net, x.T)[0][-1].T
        np.testing.assert_allclose(out, _forward(ws, bs, x), rtol=1e-12, atol=1e-12)
    assert a.extra["safetensors"] == {"names": ["fc1", "fc2", "fc3"], "pruned": False}
    assert b.extra["safetensors"]["pruned"] is True


def test_round_trip_keeps_names_style_and_values(tmp_path):
    rng = np.random.default_rng(1)
    ws, bs = _mlp(rng, (6, 5, 3))
    tensors = {"layers.10.weight": ws[1], "layers.10.bias": bs[1],  # natural order: 2 < 10
               "layers.2.weight_orig": ws[0], "layers.2.weight_mask": (ws[0] != 0).astype(
                   np.float32)}  # no bias: zeros
    net = read_safetensors(_write_raw(tmp_path / "m.safetensors", tensors), activations="relu")
    assert net.extra["safetensors"]["names"] == ["layers.2", "layers.10"]
    np.testing.assert_array_equal(net.layers[0].bias, 0)
    write_safetensors(net, tmp_path / "back.safetensors")
    again = read_safetensors(tmp_path / "back.safetensors")
    for one, two in zip(net.layers, again.layers):
        assert (one.weight != two.weight).nnz == 0 and np.array_equal(one.bias, two.bias)
    raw = (tmp_path / "back.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    assert (8 + n) % 8 == 0
    assert set(header) == {"__metadata__", "layers.2.weight_orig", "layers.2.weight_mask",
                           "layers.2.bias", "layers.10.weight_orig", "layers.10.weight_mask",
                           "layers.10.bias"}
    write_safetensors(net, tmp_path / "plain.safetensors", names=["a", "b"], pruned=False)
    header = json.loads((tmp_path / "plain.safetensors").read_bytes()[8:8 + struct.unpack(
        "<Q", (tmp_path / "plain.safetensors").read_bytes()[:8])[0]])
    assert {"a.weight", "b.weight", "a.bias", "b.bias"} <= set(header)


def test_half_precision_and_layer_selection(tmp_path):
    rng = np.random.default_rng(2)
    ws, bs = _mlp(rng, (4, 6, 6, 2))
    tensors = {"fc1.weight": ws[0].astype(np.float16), "fc1.bias": bs[0].astype(np.float16),
               "fc2.weight": ("bf16", ws[1]), "fc2.bias": ("bf16", bs[1]),
               "fc3.weight": ws[2], "fc3.bias": bs[2]}
    path = _write_raw(tmp_path / "h.safetensors", tensors)
    net = read_safetensors(path, names=["fc1", "fc2"], dtype=np.float32, activations="relu")
    assert net.sizes == (4, 6, 6)
    np.testing.assert_array_equal(net.layers[0].weight.toarray(),
                                  ws[0].astype(np.float16).astype(np.float32))
    bf = (ws[1].view(np.uint32) & 0xFFFF0000).view(np.float32)  # bf16 truncation is exact
    np.testing.assert_array_equal(net.layers[1].weight.toarray(), bf)
    with pytest.raises(InputError, match="layer 'fc1' takes 4 inputs but 'fc2' gives 6"):
        read_safetensors(path, names=["fc2", "fc1"], activations="relu")


@pytest.mark.parametrize("case, match", [
    ("short", "shorter than 8 bytes"),
    ("huge header", "header of"),
    ("bad json", "header:"),
    ("not object", "not a JSON object"),
    ("bad dtype", "unsupported dtype 'Q7'"),
    ("bad shape", "malformed header entry"),
    ("offsets", "do not hold"),
    ("cut", "do not hold"),
    ("overlap", "overlap"),
    ("no layers", "no linear layers"),
    ("mask shape", "weight_mask' has shape"),
    ("nan", "non-finite"),
    ("chain", "takes 5 inputs"),
    ("bias", "is not 3 floating point values"),
    ("1-d weight", "is not a 2-D floating point"),
    ("metadata string", "__metadata__ must be an object of strings"),
    ("metadata list", "__metadata__ must be an object of strings"),
    ("metadata true", "__metadata__ must be an object of strings"),
    ("metadata number value", "__metadata__ must be an object of strings"),
    ("huge empty weight", r"with out and in at least 1 \(shape \[1099511627775, 0\]\)"),
    ("mask half", "holds values other than 0 and 1"),
    ("mask two", "holds values other than 0 and 1"),
    ("mask negative", "holds values other than 0 and 1"),
    ("mask nan", "holds values other than 0 and 1"),
    ("weight and orig", "both 'fc1.weight' and 'fc1.weight_orig'"),
    ("named twice", "naming 'fc1.weight' twice"),
    ("bad cap", "spdnn_cap 'big' is not a positive number or none"),
    ("bad output", "spdnn_output_activation 'tanh' is not one of"),
])
def test_damaged_files_are_one_line_errors(tmp_path, case, match):
    w = np.ones((3, 4), np.float32)
    tensors = {"fc1.weight": w, "fc1.bias": np.zeros(3, np.float32)}
    patch, cut = None, 0
    path = tmp_path / "bad.safetensors"
    if case == "short":
        path.write_bytes(b"\x01\x02")
    elif case == "huge header":
        path.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    elif case == "bad json":
        path.write_bytes(struct.pack("<Q", 5) + b"{nope")
    elif case == "not object":
        path.write_bytes(struct.pack("<Q", 2) + b"[]")
    else:
        if case == "bad dtype":
            def patch(h): h["fc1.weight"]["dtype"] = "Q7"
        elif case == "bad shape":
            def patch(h): h["fc1.weight"]["shape"] = [3, -4]
        elif case == "offsets":
            def patch(h): h["fc1.weight"]["data_offsets"] = [0, 40]
        elif case == "cut":
            cut = 4
        elif case == "overlap":
            def patch(h): h["fc1.bias"]["data_offsets"] = [40, 52]
        elif case == "no layers":
            tensors = {"emb": w}
        elif case == "mask shape":
            tensors["fc1.weight_mask"] = np.ones((4, 3), np.float32)
        elif case == "nan":
            tensors["fc1.weight"] = np.full((3, 4), np.nan, np.float32)
        elif case == "chain":
            tensors["fc2.weight"] = np.ones((2, 5), np.float32)
        elif case == "bias":
            tensors["fc1.bias"] = np.zeros(4, np.float32)
        elif case == "1-d weight":
            tensors["fc1.weight"] = np.ones(12, np.float32)
        elif case.startswith("metadata"):
            meta = {"string": "relu", "list": ["relu"], "true": True,
                    "number value": {"spdnn_cap": 2}}[case.split(" ", 1)[1]]
            def patch(h): h["__metadata__"] = meta
        elif case == "huge empty weight":  # zero bytes: a shape that would size an allocation
            tensors = {"fc1.weight": np.zeros((0,), np.float32)}
            def patch(h): h["fc1.weight"]["shape"] = [2**40 - 1, 0]
        elif case.startswith("mask"):
            value = {"half": 0.5, "two": 2.0, "negative": -1.0, "nan": np.nan}[case[5:]]
            mask = np.ones((3, 4), np.float32)
            mask[1, 2] = value
            tensors = {"fc1.weight_orig": w, "fc1.weight_mask": mask}
        elif case == "weight and orig":
            tensors["fc1.weight_orig"] = w
        elif case == "named twice":
            _write_raw(path, tensors)
            raw = path.read_bytes()
            n = struct.unpack("<Q", raw[:8])[0]
            head = raw[8:8 + n].decode()
            entry = head[head.index('"fc1.weight"'):head.index('}', head.index('"fc1.weight"'))
                         + 1]
            head = head[:-1] + ", " + entry + "}"
            path.write_bytes(struct.pack("<Q", len(head)) + head.encode() + raw[8 + n:])
        elif case in ("bad cap", "bad output"):
            meta = {"spdnn_cap": "big"} if case == "bad cap" else \
                {"spdnn_output_activation": "tanh"}
            def patch(h): h["__metadata__"] = meta
        if case != "named twice":
            _write_raw(path, tensors, patch, cut)
    with pytest.raises(InputError, match=match) as err:
        read_safetensors(path, activations="relu")
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    if case in ("metadata list", "huge empty weight", "mask half", "named twice"):  # the CLI
        proc = run_spdnn("convert", "safetensors", path, "--activations", "relu", "-o",
                         tmp_path / "out.npz")
        assert_one_line_error(proc, match.replace("\\", ""))
        assert not (tmp_path / "out.npz").exists()


def test_cli_convert_both_ways(tmp_path):
    rng = np.random.default_rng(3)
    ws, bs = _mlp(rng, (64, 16, 10))  # the embedded digits: 64 features, 10 classes
    path = _write_raw(tmp_path / "m.safetensors", {"hidden.weight": ws[0], "hidden.bias": bs[0],
                                                   "out.weight": ws[1], "out.bias": bs[1]})
    proc = run_spdnn("convert", "safetensors", path, "--activations", "relu", "--layers",
                     "hidden,out", "-o",
                     tmp_path / "net.npz")
    assert proc.returncode == 0, proc.stderr
    assert "2 layers" in proc.stdout
    net = load_network(tmp_path / "net.npz")
    np.testing.assert_array_equal(net.layers[1].weight.toarray(), ws[1])
    proc = run_spdnn("convert", "network", tmp_path / "net.npz", "--to", "safetensors", "-o",
                     tmp_path / "back.safetensors")
    assert proc.returncode == 0, proc.stderr
    back = read_safetensors(tmp_path / "back.safetensors")
    assert back.extra["safetensors"]["names"] == ["hidden", "out"]
    np.testing.assert_array_equal(back.layers[0].weight.toarray(), ws[0])
    # Trained, then exported: the layer names survive training, the pattern is unchanged.
    proc = run_spdnn("train", "--network", tmp_path / "net.npz", "--data", "digits",
                     "--epochs", "1", "--save", tmp_path / "trained.npz")
    assert proc.returncode == 0, proc.stderr
    proc = run_spdnn("convert", "network", tmp_path / "trained.npz", "--to", "safetensors",
                     "-o", tmp_path / "trained.safetensors")
    assert proc.returncode == 0, proc.stderr
    trained = read_safetensors(tmp_path / "trained.safetensors")
    assert trained.extra["safetensors"]["names"] == ["hidden", "out"]
    assert trained.fingerprint() == net.fingerprint()
    assert not np.array_equal(trained.layers[0].weight.data, net.layers[0].weight.data)
    proc = run_spdnn("convert", "network", tmp_path / "net.npz", "--layers", "1", "-o",
                     tmp_path / "first.npz")  # a count keeps the first layers
    assert proc.returncode == 0 and load_network(tmp_path / "first.npz").sizes == (64, 16)
    proc = run_spdnn("convert", "safetensors", path, "--activations", "relu", "--layers",
                     "fc9", "-o",
                     tmp_path / "x.npz")
    assert_one_line_error(proc, "no layer named 'fc9'")
    assert not (tmp_path / "x.npz").exists()
    proc = run_spdnn("convert", "mtx", path, "--layers", "fc1", "-o", tmp_path / "y.npz")
    assert_one_line_error(proc, "--layers takes names only with safetensors")


def test_the_safetensors_package_reads_ours_and_we_read_its(tmp_path):
    """Interchange with the reference implementation (the ``safetensors`` package, a test
    dependency): its reader loads what spdnn writes, tensor for tensor (float32, float16 and
    the pruning mask), and spdnn reads what it writes (float64, float32, float16, bfloat16
    being torch's), every weight kept."""
    st = pytest.importorskip("safetensors.numpy",
                             reason="the safetensors package is not installed (pip install "
                                    "-e .[test])")
    rng = np.random.default_rng(4)
    ws, bs = _mlp(rng, (10, 8, 6, 3))
    theirs = {"fc1.weight": ws[0], "fc1.bias": bs[0],
              "fc2.weight_orig": ws[1].astype(np.float32),
              "fc2.weight_mask": (ws[1] != 0).astype(np.float32), "fc2.bias": bs[1],
              "fc3.weight": ws[2].astype(np.float16), "fc3.bias": bs[2].astype(np.float16)}
    st.save_file(theirs, str(tmp_path / "theirs.safetensors"), metadata={"by": "safetensors"})
    net = read_safetensors(tmp_path / "theirs.safetensors", activations="relu")
    assert net.extra["safetensors"]["names"] == ["fc1", "fc2", "fc3"]
    for k, layer in enumerate(net.layers):
        want = np.asarray(ws[k], dtype=np.float16 if k == 2 else np.float64)
        np.testing.assert_array_equal(layer.weight.toarray(), want.astype(layer.weight.dtype))
    x = rng.random((5, 10))
    np.testing.assert_allclose(reference.forward(net, x.T)[0][-1].T,
                               _forward([w.astype(np.float64) for w in
                                         (ws[0], ws[1], ws[2].astype(np.float16))],
                                        [bs[0], bs[1], bs[2].astype(np.float16)], x),
                               rtol=1e-5, atol=1e-6)  # float32 products of a few terms
    write_safetensors(net, tmp_path / "ours.safetensors")
    ours = st.load_file(str(tmp_path / "ours.safetensors"))
    assert set(ours) == {"fc1.weight_orig", "fc1.weight_mask", "fc1.bias", "fc2.weight_orig",
                         "fc2.weight_mask", "fc2.bias", "fc3.weight_orig", "fc3.weight_mask",
                         "fc3.bias"}
    for k, layer in enumerate(net.layers):
        dense = layer.weight.toarray()
        np.testing.assert_array_equal(ours[f"fc{k + 1}.weight_orig"], dense)
        np.testing.assert_array_equal(ours[f"fc{k + 1}.weight_mask"] != 0, dense != 0)
        np.testing.assert_array_equal(ours[f"fc{k + 1}.bias"], layer.bias)


def test_real_pytorch_round_trip(tmp_path):
    """A pruned torch MLP -> safetensors -> spdnn (same outputs) -> safetensors -> a fresh
    pruned torch model via load_state_dict (same weights)."""
    torch = import_torch()
    st = pytest.importorskip("safetensors.torch",
                             reason="the safetensors package is not installed")
    from torch.nn.utils import prune

    def model():
        m = torch.nn.Sequential()
        m.add_module("fc1", torch.nn.Linear(10, 8))
        m.add_module("relu", torch.nn.ReLU())
        m.add_module("fc2", torch.nn.Linear(8, 3))
        for name in ("fc1", "fc2"):
            prune.l1_unstructured(getattr(m, name), "weight", amount=0.6)
        return m.double()

    torch.manual_seed(0)
    src = model()
    st.save_file({k: v.contiguous() for k, v in src.state_dict().items()},
                 str(tmp_path / "pruned.safetensors"))
    net = read_safetensors(tmp_path / "pruned.safetensors", dtype=np.float64, activations="relu")
    assert net.nnz == int(sum((getattr(src, n).weight_mask != 0).sum() for n in ("fc1", "fc2")))
    x = np.random.default_rng(4).standard_normal((6, 10))
    with torch.no_grad():
        expected = src(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(reference.forward(net, x.T)[0][-1].T, expected, rtol=1e-6)
    write_safetensors(net, tmp_path / "back.safetensors")
    dst = model()
    dst.load_state_dict(st.load_file(str(tmp_path / "back.safetensors")))
    for name in ("fc1", "fc2"):  # (.weight is refreshed from these by the next forward)
        a, b = getattr(src, name), getattr(dst, name)
        assert torch.equal(a.weight_mask, b.weight_mask)
        assert torch.equal(b.weight_orig * b.weight_mask, a.weight_orig * a.weight_mask)
        assert torch.equal(b.bias, a.bias)  # float64 exported as float64: exactly
    with torch.no_grad():
        np.testing.assert_array_equal(dst(torch.from_numpy(x)).numpy(), expected)


def test_the_hidden_activation_is_asked_for_never_assumed(tmp_path):
    """A file that does not say what its hidden layers compute is refused without
    --activations; a wrong count, or a name spdnn does not know, is refused too; spdnn's own
    export says what they are, and reads back."""
    rng = np.random.default_rng(4)
    ws, bs = _mlp(rng, (64, 16, 12, 10))
    path = _write_raw(tmp_path / "m.safetensors", {f"fc{k + 1}.{part}": a for k in range(3)
                                                   for part, a in (("weight", ws[k]),
                                                                   ("bias", bs[k]))})
    for extra, fragments in (([], ["does not say", "--activations", "relu,relu"]),
                             (["--activations", "swish,relu"], ["unknown activation 'swish'",
                                                                "gelu_tanh"]),
                             (["--activations", "leaky_relu:x,relu"], ["slope must be a number"]),
                             (["--activations", "relu,relu,relu"], ["3 activations for 2"])):
        proc = run_spdnn("convert", "safetensors", path, *extra, "-o", tmp_path / "x.npz")
        assert_one_line_error(proc, "m.safetensors", *fragments)
        assert not (tmp_path / "x.npz").exists()
    proc = run_spdnn("convert", "safetensors", path, "--activations", "tanh,leaky_relu:0.2",
                     "-o", tmp_path / "net.npz")
    assert proc.returncode == 0, proc.stderr
    proc = run_spdnn("convert", "network", tmp_path / "net.npz", "--to", "safetensors", "-o",
                     tmp_path / "ours.safetensors")
    assert proc.returncode == 0, proc.stderr
    again = read_safetensors(tmp_path / "ours.safetensors")  # its metadata says what they are
    assert again.n_layers == 3 and again.activations == ("tanh", "leaky_relu:0.2")


def test_a_float64_network_exports_in_float64(tmp_path):
    net = read_safetensors(_write_raw(tmp_path / "m.safetensors", {
        "fc1.weight": np.random.default_rng(5).standard_normal((6, 4)),
        "fc1.bias": np.zeros(6)}), dtype=np.float64)
    write_safetensors(net, tmp_path / "back.safetensors")
    header = json.loads((tmp_path / "back.safetensors").read_bytes()[8:].split(b"}}")[0] + b"}}")
    assert header["fc1.weight"]["dtype"] == "F64"
    back = read_safetensors(tmp_path / "back.safetensors", dtype=np.float64)
    np.testing.assert_array_equal(back.layers[0].weight.toarray(), net.layers[0].weight.toarray())


def test_a_safetensors_or_torch_save_file_given_as_a_network_says_how_to_bring_it(tmp_path):
    import zipfile

    path = _write_raw(tmp_path / "m.safetensors", {"fc1.weight": np.ones((3, 2)),
                                                   "fc1.bias": np.zeros(3)})
    with pytest.raises(InputError, match="a safetensors file, not a network bundle: convert"):
        load_network(path)
    with zipfile.ZipFile(tmp_path / "model.pt", "w") as z:  # torch.save's layout
        z.writestr("model/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("model/version", b"3\n")
    with pytest.raises(InputError, match="a torch.save file .* spdnn.from_torch"):
        load_network(tmp_path / "model.pt")


def test_plain_writes_dense_weights_for_a_model_without_pruning(tmp_path):
    net = tmp_path / "net.npz"
    path = _write_raw(tmp_path / "p.safetensors", {
        "fc1.weight_orig": np.ones((3, 2)), "fc1.weight_mask": np.eye(3, 2),
        "fc1.bias": np.zeros(3)})
    assert run_spdnn("convert", "safetensors", path, "-o", net).returncode == 0
    for extra, names in (([], {"fc1.weight_orig", "fc1.weight_mask", "fc1.bias"}),
                         (["--plain"], {"fc1.weight", "fc1.bias"})):
        out = tmp_path / f"out{len(extra)}.safetensors"
        proc = run_spdnn("convert", "network", net, "--to", "safetensors", *extra, "-o", out)
        assert proc.returncode == 0, proc.stderr
        n = struct.unpack("<Q", out.read_bytes()[:8])[0]
        header = json.loads(out.read_bytes()[8:8 + n])
        assert set(header) - {"__metadata__"} == names


def test_a_tanh_model_from_torch_scores_in_spdnn_what_it_scores_in_torch(tmp_path):
    """A tanh MLP trained in torch on the digits: without --activations its file is refused
    (it once came through as ReLU and scored far below torch); with them, `spdnn infer`
    scores it as torch does, and taken as ReLU it would score otherwise."""
    torch = import_torch()
    st = pytest.importorskip("safetensors.torch",
                             reason="the safetensors package is not installed")
    from spdnn.io.loaders import load_digits

    data = load_digits("float64")
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.Tanh(),
                                torch.nn.Linear(48, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 10)).double()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.tensor(data.x_train), torch.tensor(data.y_train)
    for _ in range(30):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    with torch.no_grad():
        theirs = float((model(torch.tensor(data.x_test)).argmax(1).numpy()
                        == data.y_test).mean())
    assert theirs > 0.85
    names = {"0": "fc1", "2": "fc2", "4": "fc3"}
    st.save_file({f"{names[k.split('.')[0]]}.{k.split('.')[1]}": v.contiguous()
                  for k, v in model.state_dict().items()}, str(tmp_path / "tanh.safetensors"))
    src = tmp_path / "tanh.safetensors"
    proc = run_spdnn("convert", "safetensors", src, "-o", tmp_path / "x.npz")
    assert_one_line_error(proc, "tanh.safetensors", "does not say what its 2 hidden layer(s)")
    scores = {}
    for acts in ("tanh", "relu"):
        out = tmp_path / f"{acts}.npz"
        proc = run_spdnn("convert", "safetensors", src, "--activations", acts, "--dtype",
                         "float64", "-o", out)
        assert proc.returncode == 0, proc.stderr
        proc = run_spdnn("infer", "--network", out, "--inputs", "digits", "--dtype", "float64",
                         "--metrics-out", tmp_path / f"{acts}.json")
        assert proc.returncode == 0, proc.stderr
        scores[acts] = json.loads((tmp_path / f"{acts}.json").read_text())["accuracy"]
    assert scores["tanh"] == pytest.approx(theirs, abs=1e-12)
    assert scores["relu"] != scores["tanh"]


def test_convert_keeps_the_value_type_the_input_declares(tmp_path):
    """Without --dtype, a float64 network stays float64 exactly through safetensors (pruned and
    plain), Matrix Market and Graph Challenge TSV and back; a float32 file stays float32; text,
    which declares no type, asks for --dtype."""
    rng = np.random.default_rng(11)
    ws, bs = _mlp(rng, (12, 12, 12))
    ws = [w.astype(np.float64) * (1 + 1e-12) for w in ws]  # not a float32 value among them
    bs = [b.astype(np.float64) + 1e-13 for b in bs]
    path = _write_raw(tmp_path / "m.safetensors", {"fc1.weight": ws[0], "fc1.bias": bs[0],
                                                   "fc2.weight": ws[1], "fc2.bias": bs[1]})
    assert run_spdnn("convert", "safetensors", path, "--activations", "relu", "-o",
                     tmp_path / "net.npz").returncode == 0
    net = load_network(tmp_path / "net.npz")
    assert net.dtype == np.float64
    np.testing.assert_array_equal(net.layers[0].weight.toarray(), ws[0])
    np.testing.assert_array_equal(net.layers[1].bias, bs[1])

    def same(other):  # noqa: ANN001, ANN202
        assert other.dtype == np.float64
        for a, b in zip(net.layers, other.layers):
            np.testing.assert_array_equal(a.weight.toarray(), b.weight.toarray())

    for style in ([], ["--plain"]):
        out = tmp_path / f"out{len(style)}.safetensors"
        assert run_spdnn("convert", "network", tmp_path / "net.npz", "--to", "safetensors",
                         *style, "-o", out).returncode == 0
        same(read_safetensors(out, dtype=None))
        proc = run_spdnn("convert", "safetensors", out, "-o", tmp_path / f"b{len(style)}.npz")
        assert proc.returncode == 0, proc.stderr
        same(load_network(tmp_path / f"b{len(style)}.npz"))
    for fmt, source in (("mtx", "mtx"), ("graphchallenge", "graphchallenge")):
        assert run_spdnn("convert", "network", tmp_path / "net.npz", "--to", fmt, "-o",
                         tmp_path / fmt).returncode == 0
        inputs = [tmp_path / fmt / f"layer{k}.mtx" for k in (1, 2)] if fmt == "mtx" \
            else [tmp_path / fmt]
        proc = run_spdnn("convert", source, *inputs, "-o", tmp_path / "t.npz")
        assert_one_line_error(proc, "text values declare no value type: give --dtype")
        proc = run_spdnn("convert", source, *inputs, "--dtype", "float64", "-o",
                         tmp_path / f"{fmt}.npz")
        assert proc.returncode == 0, proc.stderr
        same(load_network(tmp_path / f"{fmt}.npz"))
    single = _write_raw(tmp_path / "s.safetensors", {"fc1.weight": ws[0].astype(np.float32)})
    assert run_spdnn("convert", "safetensors", single, "--activations", "relu", "-o",
                     tmp_path / "s.npz").returncode == 0
    assert load_network(tmp_path / "s.npz").dtype == np.float32


def test_layer_names_cap_and_output_activation_round_trip_exactly(tmp_path):
    """A name given twice is refused; --layers selects on a safetensors to safetensors
    convert; the cap and the output activation the export writes come back."""
    from spdnn.io.bundle import save_network
    from spdnn.model.generate import random_network

    rng = np.random.default_rng(4)
    ws, bs = _mlp(rng, (12, 9, 7, 4))
    path = _write_raw(tmp_path / "m.safetensors", {
        "fc1.weight": ws[0], "fc1.bias": bs[0], "fc2.weight": ws[1], "fc2.bias": bs[1],
        "fc3.weight": ws[2], "fc3.bias": bs[2]})
    proc = run_spdnn("convert", "safetensors", path, "--activations", "relu", "--layers",
                     "fc1,fc1,fc2", "-o", tmp_path / "x.npz")
    assert_one_line_error(proc, "--layers names 'fc1' twice")
    proc = run_spdnn("convert", "network", tmp_path / "missing.npz", "--to", "safetensors",
                     "--layers", "a,a", "-o", tmp_path / "y.safetensors")
    assert proc.returncode == 2
    proc = run_spdnn("convert", "safetensors", path, "--activations", "relu", "--layers",
                     "fc1,fc2", "--to", "safetensors", "-o", tmp_path / "two.safetensors")
    assert proc.returncode == 0, proc.stderr
    two = read_safetensors(tmp_path / "two.safetensors")
    assert two.n_layers == 2 and two.extra["safetensors"]["names"] == ["fc1", "fc2"]
    np.testing.assert_array_equal(two.layers[1].weight.toarray(), ws[1])

    net = random_network([10, 8, 6], 4, seed=2, cap=2.0).with_activations("relu")
    from dataclasses import replace
    net = replace(net, output_activation="relu")
    save_network(net, tmp_path / "capped.npz")
    assert run_spdnn("convert", "network", tmp_path / "capped.npz", "--to", "safetensors",
                     "-o", tmp_path / "capped.safetensors").returncode == 0
    assert run_spdnn("convert", "safetensors", tmp_path / "capped.safetensors", "-o",
                     tmp_path / "back.npz").returncode == 0
    back = load_network(tmp_path / "back.npz")
    assert back.cap == 2.0 and back.output_activation == "relu"
    assert run_spdnn("convert", "safetensors", tmp_path / "capped.safetensors", "--cap",
                     "none", "--output-activation", "linear", "-o",
                     tmp_path / "plain.npz").returncode == 0  # the flags still decide
    plain = load_network(tmp_path / "plain.npz")
    assert plain.cap is None and plain.output_activation == "linear"
