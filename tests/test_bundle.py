import json
import zipfile

import numpy as np
import pytest

from spdnn.errors import InputError
from spdnn.io.bundle import NETWORK_FORMAT, NetworkBundle, load_network, save_network
from spdnn.model.generate import add_head, radixnet, random_network
from tests.helpers import small_network


def _equal(a, b):
    assert a.sizes == b.sizes and a.meta() == b.meta()
    for la, lb in zip(a.layers, b.layers):
        assert (la.weight != lb.weight).nnz == 0
        np.testing.assert_array_equal(la.weight.indices, lb.weight.indices)
        np.testing.assert_array_equal(la.bias, lb.bias)
        assert la.weight.dtype == lb.weight.dtype


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_round_trip_is_lossless(tmp_path, dtype):
    net = small_network(cap=32.0, output_activation="relu").astype(dtype)
    save_network(net, tmp_path / "net.npz")
    back = load_network(tmp_path / "net.npz")
    _equal(net, back)
    assert back.fingerprint() == net.fingerprint()
    assert list(tmp_path.iterdir()) == [tmp_path / "net.npz"]  # no temporary left behind


def test_keys_follow_the_documented_format(tmp_path):
    net = small_network()
    save_network(net, tmp_path / "net.npz")
    with np.load(tmp_path / "net.npz", allow_pickle=False) as z:
        assert str(z["format"]) == NETWORK_FORMAT
        assert int(z["n_layers"]) == 3
        meta = json.loads(str(z["meta"]))
        assert meta["activations"] == ["relu", "relu"] and meta["cap"] is None
        assert meta["output_activation"] == "linear"
        assert z["W2_shape"].tolist() == [7, 9]
        assert set(z.files) >= {"W1_indptr", "W1_indices", "W1_data", "b1", "b3"}


def test_one_layer_is_read_alone(tmp_path):
    net = small_network()
    save_network(net, tmp_path / "net.npz")
    with NetworkBundle(tmp_path / "net.npz") as bundle:
        assert bundle.sizes == net.sizes
        assert bundle.fingerprint() == net.fingerprint()
        layer = bundle.layer(2)
        np.testing.assert_array_equal(layer.weight.toarray(), net.layers[1].weight.toarray())


def _rewrite(src, dst, **changes):
    with np.load(src, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    for k, v in changes.items():
        if v is None:
            arrays.pop(k)
        else:
            arrays[k] = v
    np.savez(dst, **arrays)


@pytest.mark.parametrize(
    "changes, problem",
    [
        ({"format": np.array("spdnn-network/9")}, "unknown format version 'spdnn-network/9'"),
        ({"W2_data": None}, "missing key 'W2_data'"),
        ({"W1_data": np.full(36, np.nan)}, "layer 1: non-finite value"),
        ({"W2_shape": np.array([7, 8])}, "shapes do not chain"),
        ({"meta": np.array("{not json")}, "meta is not valid JSON"),
        ({"meta": np.array('{"activations": ["relu", "relu"], "cap": null, '
                           '"output_activation": "x"}')}, "output_activation"),
        ({"meta": np.array('{"activations": ["relu", "swish"], "cap": null, '
                           '"output_activation": "linear"}')}, "unknown activation 'swish'"),
        ({"meta": np.array('{"activations": ["relu"], "cap": null, '
                           '"output_activation": "linear"}')}, "1 activations for 2 hidden"),
        ({"meta": np.array('{"activation": "relu", "cap": null, "output_activation": "linear"}')},
         "names one activation per hidden layer"),
        ({"format": np.array("spdnn-network/1")}, "has no per-layer activations"),
        ({"W1_pruned": np.zeros(5)}, "W1_pruned must be 72 floats"),
        ({"W1_pruned": np.full(72, np.inf)}, "non-finite pruned value"),
        ({"format": np.array("spdnn-network/1"), "meta": np.array(
            '{"activation": "tanh", "cap": null, "output_activation": "linear"}')},
         "format-1 activation"),
    ],
)
def test_bad_bundles(tmp_path, changes, problem):
    save_network(small_network(), tmp_path / "good.npz")
    _rewrite(tmp_path / "good.npz", tmp_path / "bad.npz", **changes)
    with pytest.raises(InputError, match=problem) as err:
        load_network(tmp_path / "bad.npz")
    assert str(tmp_path / "bad.npz") in str(err.value)


def test_a_format_1_bundle_loads_as_relu_and_saves_as_format_2(tmp_path):
    """Before per-layer activations a bundle said "activation": "relu" for all hidden layers;
    such a bundle still loads, as ReLU on every one, and is written back in format 2."""
    net = small_network(activations=("tanh", "leaky_relu:-0.5"))
    save_network(net, tmp_path / "new.npz")
    assert load_network(tmp_path / "new.npz").activations == ("tanh", "leaky_relu:-0.5")
    _rewrite(tmp_path / "new.npz", tmp_path / "old.npz", format=np.array("spdnn-network/1"),
             meta=np.array('{"activation": "relu", "cap": 2.0, "output_activation": "linear"}'))
    old = load_network(tmp_path / "old.npz")
    assert old.activations == ("relu", "relu") and old.cap == 2.0
    save_network(old, tmp_path / "again.npz")
    with np.load(tmp_path / "again.npz", allow_pickle=False) as z:
        assert str(z["format"]) == NETWORK_FORMAT == "spdnn-network/2"


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_network(tmp_path / "nope.npz")
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 this is not a zip")
    with pytest.raises(InputError, match="not a readable network"):
        load_network(tmp_path / "junk.npz")
    save_network(small_network(), tmp_path / "net.npz")
    raw = (tmp_path / "net.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(InputError):
        load_network(tmp_path / "cut.npz")


def test_failed_save_leaves_no_file(tmp_path):
    net = small_network()
    net.layers[0].weight.data[0] = np.nan
    with pytest.raises(InputError):
        save_network(net, tmp_path / "net.npz")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(InputError, match="does not exist"):
        save_network(small_network(), tmp_path / "no" / "net.npz")


def test_pickled_arrays_are_refused(tmp_path):
    save_network(small_network(), tmp_path / "good.npz")
    _rewrite(tmp_path / "good.npz", tmp_path / "bad.npz",
             meta=np.array([{"activation": "relu"}], dtype=object))
    with pytest.raises(InputError):
        load_network(tmp_path / "bad.npz")
    assert zipfile.is_zipfile(tmp_path / "bad.npz")


def test_rows_read_in_bounded_blocks_equal_the_whole_layer(tmp_path, monkeypatch):
    """A rank's rows come from the file in groups of ranges spanning at most RANGE_BLOCK
    entries, the fingerprint streams the pattern in blocks, and the sortedness check runs in
    blocks: with blocks far smaller than a row, every boundary case is crossed, and the rows,
    the fingerprint and the refusals equal the whole-array answers."""
    from spdnn.io import npz
    from spdnn.model.csr import check_pattern
    from spdnn.model.fingerprint import Fingerprint

    net = small_network(sizes=(40, 30, 20), fan_in=12, seed=3)
    path = tmp_path / "net.npz"
    save_network(net, path)
    with NetworkBundle(path) as bundle:
        whole = bundle.fingerprint()
        monkeypatch.setattr(npz, "RANGE_BLOCK", 5)
        monkeypatch.setattr("spdnn.io.bundle.RANGE_BLOCK", 3)
        monkeypatch.setattr("spdnn.model.fingerprint.HASH_BLOCK", 2)
        monkeypatch.setattr("spdnn.model.csr.CHECK_BLOCK", 4)
        fp = Fingerprint(bundle.sizes)
        for k, layer in enumerate(net.layers, start=1):
            rows = np.array([0, 2, 3, 7, 8, 9, layer.n_out - 1])
            got = bundle.rows(k, rows, fingerprint=fp)
            expected = layer.weight[rows]
            np.testing.assert_array_equal(got.weight.toarray(), expected.toarray())
            np.testing.assert_array_equal(got.bias, layer.bias[rows])
        assert fp.hexdigest() == whole
    w = net.layers[0].weight
    for e in range(1, w.nnz):  # a duplicate or a step back at every position is found
        row = int(np.searchsorted(w.indptr, e, side="right")) - 1
        if w.indptr[row] == e:
            continue  # the first entry of a row may be anything
        for kind, value in (("duplicate", w.indices[e - 1]), ("unsorted", w.indices[e - 1] - 1)):
            if value < 0:
                continue
            bad = w.indices.copy()
            bad[e] = value
            with pytest.raises(InputError, match=f"{kind} column index in row {row}"):
                check_pattern(w.indptr, bad, w.shape, "net", "layer 1")
    check_pattern(w.indptr, w.indices, w.shape, "net", "layer 1")


def test_a_radixnet_written_layer_by_layer_equals_the_one_built_whole(tmp_path):
    from spdnn.io.bundle import write_network
    from tests.helpers import run_spdnn

    proc = run_spdnn("generate", "radixnet", "--neurons", "1024", "--layers", "9", "--seed",
                     "4", "--bias", "-0.3", "--head", "10", "-o", tmp_path / "rx.npz")
    assert proc.returncode == 0, proc.stderr
    whole = add_head(radixnet(1024, 9, seed=4), 10, seed=4)
    assert whole.fingerprint() in proc.stdout
    read = load_network(tmp_path / "rx.npz")
    assert read.meta() == whole.meta()
    for a, b in zip(read.layers, whole.layers):
        assert (a.weight != b.weight).nnz == 0 and np.array_equal(a.bias, b.bias)
    with pytest.raises(InputError, match="2 layers written, the sizes .* need 3"):
        write_network(tmp_path / "short.npz", (1024,) * 4, whole.layers[:2],
                      {**whole.meta(), "activations": ["relu"] * 2})
    assert not (tmp_path / "short.npz").exists()


@pytest.mark.parametrize("error", [RuntimeError, SyntaxError, NotImplementedError])
def test_an_internal_error_is_not_reported_as_a_damaged_file(tmp_path, monkeypatch, error):
    """Only the zip and npy layers' own failures mean a damaged file; the same exception types
    raised anywhere else are bugs, and must reach the user as such."""
    import spdnn.io.npz as npz_module

    save_network(random_network([6, 5, 3], 2, seed=0), tmp_path / "net.npz")

    def broken(fh):
        raise error("a bug, not the file")

    monkeypatch.setattr(npz_module.npy, "read_magic", broken)
    with pytest.raises(error, match="a bug"):
        NetworkBundle(tmp_path / "net.npz")


def test_a_float16_bundle_reads_as_float32_on_every_path(tmp_path):
    """float16 values, which train and infer read, are float32 to the partitioner too (it
    ended in a traceback); other dtypes are still refused in one line."""
    from spdnn.io.bundle import load_network, save_network
    from tests.helpers import run_cli, small_network

    save_network(small_network(dtype="float32"), tmp_path / "n.npz")
    with np.load(tmp_path / "n.npz") as z:
        arrays = {k: z[k] for k in z.files}
    for k in list(arrays):
        if k.endswith("_data") or (k[0] == "b" and k[1:].isdigit()):
            arrays[k] = arrays[k].astype(np.float16)
    np.savez(tmp_path / "h.npz", **arrays)
    assert load_network(tmp_path / "h.npz").dtype == np.float32
    proc = run_cli(tmp_path / "h.npz", "-P", "2", "-o", tmp_path / "p.npz", module="partition")
    assert proc.returncode == 0, proc.stderr
