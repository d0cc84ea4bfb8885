import json
import os

import numpy as np
import pytest

from spdnn.io.bundle import load_network, save_network
from spdnn.io.idx import write_idx
from tests.helpers import assert_one_line_error, launch, run_spdnn, small_network


def test_help_has_an_example():
    proc = run_spdnn("--help")
    assert proc.returncode == 0 and "examples:" in proc.stdout and "spdnn train" in proc.stdout


def test_every_command_answers_version():
    """``--version`` on each command and subcommand: the installed version, exit 0."""
    from importlib.metadata import version

    from tests.helpers import run_cli

    for args, module, prog in ((["--version"], "spdnn", "spdnn"),
                               (["generate", "random", "--version"], "spdnn", "spdnn"),
                               (["--version"], "partition", "spdnn-partition"),
                               (["model", "--version"], "partition", "spdnn-partition")):
        proc = run_cli(*args, module=module)
        assert (proc.returncode, proc.stdout, proc.stderr) == (
            0, f"{prog} {version('spdnn')}\n", ""), args
    proc = run_spdnn("train", "--version")  # before MPI starts
    assert (proc.returncode, proc.stdout) == (0, f"spdnn {version('spdnn')}\n"), proc.stderr


@pytest.mark.long
def test_generate_train_save_infer(tmp_path):
    assert run_spdnn("generate", "random", "--sizes", "64,64,64", "--fan-in", "8", "--head",
                     "10", "-o", tmp_path / "net.npz").returncode == 0
    proc = run_spdnn("train", "--network", tmp_path / "net.npz", "--data", "digits",
                     "--epochs", "2", "--batch-size", "32", "--save", tmp_path / "t.npz",
                     "--metrics-out", tmp_path / "m.json")
    assert proc.returncode == 0, proc.stderr
    assert "epoch   2" in proc.stdout
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert len(metrics["epochs"]) == 2 and metrics["epochs"][1]["test_accuracy"] > 0.5
    assert load_network(tmp_path / "t.npz").fingerprint() == \
        load_network(tmp_path / "net.npz").fingerprint()
    proc = run_spdnn("infer", "--network", tmp_path / "t.npz", "--inputs", "digits")
    assert proc.returncode == 0 and "accuracy" in proc.stdout


@pytest.mark.long
def test_threads_give_the_same_weights_and_bad_counts_fail(tmp_path):
    """--threads N splits each kernel's rows over threads; every row is still computed by
    one thread in one order, so the trained weights are bit-identical to one thread."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 cores for a numba pool of 2 threads")
    assert run_spdnn("generate", "random", "--sizes", "64,300,200", "--fan-in", "12", "--head",
                     "10", "-o", tmp_path / "net.npz").returncode == 0
    saved = {}
    for n in (1, 2):
        proc = run_spdnn("train", "--network", tmp_path / "net.npz", "--data", "digits",
                         "--epochs", "1", "--max-steps", "4", "--batch-size", "32",
                         "--dtype", "float64", "--threads", str(n),
                         "--save", tmp_path / f"t{n}.npz")
        assert proc.returncode == 0, proc.stderr
        saved[n] = load_network(tmp_path / f"t{n}.npz")
    for a, b in zip(saved[1].layers, saved[2].layers):
        np.testing.assert_array_equal(a.weight.data, b.weight.data)
        np.testing.assert_array_equal(a.bias, b.bias)
    assert not np.array_equal(saved[1].layers[0].weight.data,
                              load_network(tmp_path / "net.npz").layers[0].weight.data)
    proc = run_spdnn("train", "--network", tmp_path / "net.npz", "--threads", "4096")
    assert_one_line_error(proc, "--threads 4096: more than the", "cores of this node")
    proc = run_spdnn("train", "--network", tmp_path / "net.npz", "--exchange", "zip")
    assert_one_line_error(proc, "--exchange: must be one of auto, dense, sparse")


def test_train_on_npz_and_mnist_idx(tmp_path):
    import json

    from spdnn.io.bundle import load_network
    from spdnn.io.loaders import load_dataset

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (40, 4, 4), dtype=np.uint8)
    y = (x.reshape(40, -1).mean(axis=1) > 127).astype(np.uint8)
    for split, n in (("train", 30), ("t10k", 10)):
        write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", x[:n] if split == "train" else x[30:])
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte", y[:n] if split == "train" else y[30:])
    # What the reader makes of the IDX files: pixels / 255, the labels as written, both splits.
    data = load_dataset(f"mnist:{tmp_path}", "float32")
    assert data.x_train.dtype == np.float32 and data.x_train.shape == (30, 16)
    np.testing.assert_allclose(data.x_train, x[:30].reshape(30, -1) / 255, rtol=1e-6)
    np.testing.assert_array_equal(data.y_train, y[:30])
    np.testing.assert_array_equal(data.y_test, y[30:])
    save_network(small_network((16, 8, 2)), tmp_path / "net.npz")
    proc = run_spdnn("train", "--network", tmp_path / "net.npz", "--data", f"mnist:{tmp_path}",
                     "--epochs", "1", "--batch-size", "8", "--metrics-out", tmp_path / "m.json")
    assert proc.returncode == 0, proc.stderr
    assert "30 samples" in proc.stdout, proc.stdout
    epoch = json.loads((tmp_path / "m.json").read_text())["epochs"][0]
    assert epoch["samples"] == 30 and epoch["epoch_steps"] == 4  # 8 + 8 + 8 + 6
    assert epoch["test_accuracy"] is not None and 0 <= epoch["test_accuracy"] <= 1
    # npz data, float64 arithmetic: the trained network comes back in float64.
    np.savez(tmp_path / "d.npz", x_train=x.reshape(40, -1) / 255.0, y_train=y)
    proc = run_spdnn("train", "--network", tmp_path / "net.npz", "--data",
                     f"npz:{tmp_path / 'd.npz'}", "--epochs", "1", "--dtype", "float64",
                     "--batch-size", "16", "--save", tmp_path / "t64.npz",
                     "--metrics-out", tmp_path / "m64.json")
    assert proc.returncode == 0, proc.stderr
    assert "40 samples" in proc.stdout, proc.stdout
    epoch = json.loads((tmp_path / "m64.json").read_text())["epochs"][0]
    assert epoch["samples"] == 40 and epoch["test_accuracy"] is None  # no test split
    assert load_network(tmp_path / "t64.npz").dtype == np.float64


def test_convert_round_trips_through_mtx_and_graphchallenge(tmp_path):
    assert run_spdnn("generate", "radixnet", "--neurons", "1024", "--layers", "3",
                     "-o", tmp_path / "rx.npz").returncode == 0
    assert run_spdnn("convert", "network", tmp_path / "rx.npz", "--to", "graphchallenge",
                     "-o", tmp_path / "gc").returncode == 0
    proc = run_spdnn("convert", "graphchallenge", "--dtype", "float32",
                     tmp_path / "gc", "--bias", "-0.3", "--cap",
                     "32", "-o", tmp_path / "back.npz")
    assert proc.returncode == 0, proc.stderr
    assert run_spdnn("convert", "network", tmp_path / "rx.npz", "--to", "mtx",
                     "-o", tmp_path / "mtx").returncode == 0
    files = [tmp_path / "mtx" / f"layer{k}.mtx" for k in (1, 2, 3)]
    proc = run_spdnn("convert", "mtx", "--dtype", "float32",
                     *files, "--bias", "-0.3", "--cap", "32",
                     "--output-activation", "relu", "-o", tmp_path / "back2.npz")
    assert proc.returncode == 0, proc.stderr
    a, b, c = (load_network(tmp_path / n) for n in ("rx.npz", "back.npz", "back2.npz"))
    for other in (b, c):
        assert other.meta()["cap"] == 32 and other.output_activation == "relu"
        for la, lb in zip(a.layers, other.layers):
            assert (la.weight != lb.weight).nnz == 0
            np.testing.assert_array_equal(la.bias, lb.bias)


# --------------------------------------------------------------------------- bad input


def test_bad_tsv_in_a_graphchallenge_directory(tmp_path):
    (tmp_path / "gc").mkdir()
    (tmp_path / "gc" / "n4-l1.tsv").write_text("1\t1\t1\n2\tabc\t1\n")
    proc = run_spdnn("convert", "graphchallenge", "--dtype", "float32",
                     tmp_path / "gc", "-o", tmp_path / "o.npz")
    assert_one_line_error(proc, "n4-l1.tsv:2", "non-numeric field 'abc'")
    assert not (tmp_path / "o.npz").exists()


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 1\n", "truncated"),
        ("%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 1 1\n", ":3: expected 3"),
        ("%%MatrixMarket matrix coordinate real general\n2 2 1\n0 1 1\n", ":3: row index 0"),
    ],
)
def test_bad_mtx_layer(tmp_path, content, fragment):
    (tmp_path / "l1.mtx").write_text(content)
    proc = run_spdnn("convert", "mtx", "--dtype", "float32",
                     tmp_path / "l1.mtx", "-o", tmp_path / "o.npz")
    assert_one_line_error(proc, "l1.mtx", fragment)
    assert list(tmp_path.iterdir()) == [tmp_path / "l1.mtx"]


def test_layers_that_do_not_chain(tmp_path):
    for name, shape in (("a.mtx", "3 2 1"), ("b.mtx", "2 4 1")):
        (tmp_path / name).write_text(
            f"%%MatrixMarket matrix coordinate real general\n{shape}\n1 1 1\n")
    proc = run_spdnn("convert", "mtx", "--dtype", "float32", tmp_path / "a.mtx", tmp_path / "b.mtx",
                     "-o", tmp_path / "o.npz")
    assert_one_line_error(proc, "shapes do not chain")


def test_nan_weights_and_unknown_version(tmp_path):
    net = small_network()
    save_network(net, tmp_path / "net.npz")
    with np.load(tmp_path / "net.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["W1_data"] = arrays["W1_data"].copy()
    arrays["W1_data"][3] = np.inf
    np.savez(tmp_path / "inf.npz", **arrays)
    proc = run_spdnn("infer", "--network", tmp_path / "inf.npz", "--inputs", "digits")
    assert_one_line_error(proc, "inf.npz", "non-finite")
    arrays["W1_data"][3] = 0.5
    arrays["format"] = np.array("spdnn-network/9")
    np.savez(tmp_path / "v9.npz", **arrays)
    proc = run_spdnn("train", "--network", tmp_path / "v9.npz")
    assert_one_line_error(proc, "v9.npz", "unknown format version")


def test_missing_files_and_feature_mismatch(tmp_path):
    proc = run_spdnn("train", "--network", tmp_path / "missing.npz")
    assert_one_line_error(proc, "missing.npz", "no such file")
    save_network(small_network(), tmp_path / "net.npz")
    proc = run_spdnn("train", "--network", tmp_path / "net.npz", "--data", "digits")
    assert_one_line_error(proc, "digits", "64 features", "12 neurons")
    proc = run_spdnn("train", "--network", tmp_path / "net.npz", "--data",
                     f"mnist:{tmp_path}")
    assert_one_line_error(proc, "train-images-idx3-ubyte", "no such file")


def test_bad_data_is_reported_before_the_kernels_load(tmp_path):
    """The kernels load (~0.4 s) only once every input of the job is checked."""
    save_network(small_network(sizes=(8, 6, 4)), tmp_path / "net.npz")
    code = ("import sys, spdnn\n"
            "from spdnn.errors import SpdnnError\n"
            "for kw in ({'data': 'npz:' + sys.argv[2]}, {'inputs': sys.argv[2]}):\n"
            "    try:\n"
            "        (spdnn.train if 'data' in kw else spdnn.infer)(sys.argv[1], **kw)\n"
            "    except SpdnnError as exc:\n"
            "        print('error:', exc)\n"
            "print(sorted(m for m in sys.modules if m.startswith('spdnn.kernels._numba')))\n")
    proc = launch(0, "-c", code, tmp_path / "net.npz", tmp_path / "missing.npz", module=None)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("error:") == 2 and "missing.npz" in proc.stdout, proc.stdout
    assert proc.stdout.splitlines()[-1] == "[]", proc.stdout


@pytest.mark.parametrize("stem", ["train-images-idx3-ubyte", "t10k-images-idx3-ubyte"])
def test_a_damaged_gzip_mnist_file_is_one_line(tmp_path, stem):
    """Bytes flipped inside a gzipped IDX file's deflate stream (zlib's "invalid stored block
    lengths", not gzip's CRC check), in the file read whole and in the one whose header
    alone is read: one line naming it."""
    import gzip

    rng = np.random.default_rng(0)
    for name, a in (("train-images-idx3-ubyte", rng.integers(0, 255, (6, 2, 2), np.uint8)),
                    ("train-labels-idx1-ubyte", np.arange(6, dtype=np.uint8) % 2),
                    ("t10k-images-idx3-ubyte", rng.integers(0, 255, (4, 2, 2), np.uint8)),
                    ("t10k-labels-idx1-ubyte", np.arange(4, dtype=np.uint8) % 2)):
        write_idx(tmp_path / name, a)
        gz = bytearray(gzip.compress((tmp_path / name).read_bytes()))
        if name == stem:
            gz[12:20] = bytes(b ^ 0x5A for b in gz[12:20])
        (tmp_path / f"{name}.gz").write_bytes(bytes(gz))
        (tmp_path / name).unlink()
    save_network(small_network((4, 3, 2)), tmp_path / "net.npz")
    for command in ("train", "infer"):
        flag = "--data" if command == "train" else "--inputs"
        proc = run_spdnn(command, "--network", tmp_path / "net.npz", flag, f"mnist:{tmp_path}")
        assert_one_line_error(proc, f"{stem}.gz")


def test_truncated_idx(tmp_path):
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((4, 2, 2), dtype=np.uint8))
    raw = (tmp_path / "train-images-idx3-ubyte").read_bytes()
    (tmp_path / "train-images-idx3-ubyte").write_bytes(raw[:-1])
    save_network(small_network((4, 3, 2)), tmp_path / "net.npz")
    proc = run_spdnn("train", "--network", tmp_path / "net.npz", "--data", f"mnist:{tmp_path}")
    assert_one_line_error(proc, "train-images-idx3-ubyte", "truncated")


@pytest.mark.long
def test_graph_challenge_cli(graphchallenge_dir, tmp_path):
    proc = run_spdnn("convert", "graphchallenge", "--dtype", "float32",
                     graphchallenge_dir / "neuron1024", "--layers",
                     "120", "--bias", "-0.3", "--cap", "32", "-o", tmp_path / "gc.npz")
    assert proc.returncode == 0, proc.stderr
    proc = run_spdnn("infer", "--network", tmp_path / "gc.npz", "--inputs",
                     graphchallenge_dir / "sparse-images-1024_subset.mtx", "--truth",
                     graphchallenge_dir / "neuron1024-l120-categories_subset.mtx",
                     "--categories-out", tmp_path / "cats.tsv")
    assert proc.returncode == 0, proc.stderr
    assert "categories match the truth file" in proc.stdout
    assert (tmp_path / "cats.tsv").read_text().split() == [
        "287", "295", "386", "427", "428", "529", "571", "666", "757", "943", "945", "1031",
        "1097", "1098", "1177", "1184", "1190", "1194", "1200"]


def test_reports_say_what_happened(tmp_path):
    """One model part prints no all-zero traffic table; an epoch cut by --max-steps says so; a
    resume with nothing left to do says so and writes nothing."""
    save_network(small_network((64, 16, 10)), tmp_path / "net.npz")
    base = ["train", "--network", tmp_path / "net.npz", "--data", "digits", "--batch-size", "64"]
    proc = run_spdnn(*base, "--epochs", "2", "--max-steps", "30", "--checkpoint-dir",
                     tmp_path / "ck")
    assert proc.returncode == 0, proc.stderr
    assert "forward rows (counted/plan)" not in proc.stdout
    assert "1 model part: no rows exchanged" in proc.stdout
    assert "epoch   1: loss" in proc.stdout  # 23 batches of 64: the whole epoch
    assert "epoch   2 (7 of 23 steps): loss" in proc.stdout
    before = {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in (tmp_path / "ck").iterdir()}
    proc = run_spdnn(*base, "--epochs", "1", "--resume", tmp_path / "ck", "--save",
                     tmp_path / "never.npz")
    assert proc.returncode == 0, proc.stderr
    assert "is at step 30 (epoch 2, batch 7), already at --epochs 1: nothing to do" in \
        proc.stdout
    after = {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in (tmp_path / "ck").iterdir()}
    assert after == before and not (tmp_path / "never.npz").exists()


def test_progress_lines_under_mpirun_with_stdout_in_a_file(tmp_path):
    from partition.methods import partition_network
    from spdnn.io.planfile import save_plan
    from spdnn.model.plan import network_patterns

    net = small_network((64, 16, 10))
    save_network(net, tmp_path / "net.npz")
    save_plan(partition_network(network_patterns(net), 2, method="cyclic",
                                fingerprint=net.fingerprint()), tmp_path / "plan.npz")
    proc = launch(2, "train", "--network", tmp_path / "net.npz", "--plan", tmp_path / "plan.npz",
                  "--data", "digits", "--epochs", "1", env={"SPDNN_PROGRESS_SECONDS": "0"},
                  timeout=120)  # stdout is a pipe, as a log file would be: not a terminal
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("  steps: ")]
    assert len(lines) == 22  # steps 2..23 of the epoch, printed once (rank 0)
    assert lines[0].startswith("  steps: 2/23 (") and "samples/s, ETA" in lines[0]
    assert lines[-1].startswith("  steps: 23/23 (")


def test_help_pages_show_meanings_defaults_and_their_own_examples():
    train = run_spdnn("train", "--help").stdout
    assert "learning rate (default: sgd 0.05, adam 0.001" in train
    assert "samples per optimizer step (default: 64)" in train and "(default: None)" not in train
    assert "spdnn train --network" in train and "spdnn infer --network" not in train
    general = run_spdnn("generate", "--help").stdout
    random_page = run_spdnn("generate", "random", "--help").stdout
    radix_page = run_spdnn("generate", "radixnet", "--help").stdout
    assert random_page != general and random_page != radix_page
    assert "--sizes" in random_page and "--neurons" not in random_page
    assert "--neurons" in radix_page and "--sizes" not in radix_page
    assert "spdnn generate random --sizes" in random_page
    assert "spdnn convert mtx" in run_spdnn("convert", "--help").stdout
    assert "--categories-out" in run_spdnn("infer", "--help").stdout
