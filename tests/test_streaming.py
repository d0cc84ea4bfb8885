"""Layer streaming from the command line (one process): a network whose weights pass
``--memory-limit`` is read in blocks and gives the in-memory accuracy; ``--dry-run`` shows the
blocks; the activations between blocks spill to scratch files and come back unchanged; a file
that changes under a streamed job is refused."""

from __future__ import annotations

import os
import re
import shutil

import numpy as np
import pytest
import scipy.sparse as sp

from spdnn.errors import InputError
from spdnn.io.bundle import NetworkBundle, save_network
from spdnn.model.generate import random_network
from spdnn.runtime.boundary import BoundaryStore, Chunk
from tests.helpers import assert_one_line_error, dry_run_baseline, run_spdnn


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> str:
    """41 layers of 2,048 neurons (5.3M weights, 44 MB): weights, not buffers, dominate."""
    net = random_network([64] + [2048] * 40 + [10], 64, seed=0, dtype="float32")
    path = tmp_path_factory.mktemp("stream") / "wide.npz"
    save_network(net, path)
    return str(path)


def _accuracy(text: str) -> str:
    return re.search(r"accuracy (\S+) on", text).group(1)


def test_weights_over_the_limit_stream_in_blocks_with_the_in_memory_accuracy(wide):
    whole = run_spdnn("infer", "--network", wide, "--inputs", "digits", "--memory-limit",
                      "none")
    assert whole.returncode == 0, whole.stderr
    assert "streaming" not in whole.stdout
    # 40 MB above the baseline the job measures: less than its 44 MB of weights
    limit = dry_run_baseline("infer", "--network", wide, "--inputs", "digits") + 40_000_000
    dry = run_spdnn("infer", "--network", wide, "--inputs", "digits", "--memory-limit", limit,
                    "--dry-run")
    assert dry.returncode == 0, dry.stderr
    blocks = re.search(r"streaming 41 layers in (\d+) block\(s\) of at most (\d+) \(the "
                       r"weights pass --memory-limit\)", dry.stdout)
    assert blocks and int(blocks.group(1)) > 1, dry.stdout
    streamed = run_spdnn("infer", "--network", wide, "--inputs", "digits", "--memory-limit",
                         limit)
    assert streamed.returncode == 0, streamed.stderr
    assert blocks.group(0) in streamed.stdout
    assert _accuracy(streamed.stdout) == _accuracy(whole.stdout)


def test_stream_layers_must_be_a_positive_count(wide):
    proc = run_spdnn("infer", "--network", wide, "--inputs", "digits", "--stream-layers", "0")
    assert_one_line_error(proc, "--stream-layers")


def test_activations_spill_to_scratch_and_come_back_unchanged(tmp_path):
    rng = np.random.default_rng(0)
    dense = rng.random((30, 20)).astype(np.float32)
    sparse = np.where(rng.random((30, 20)) < 0.1, dense, 0).astype(np.float32)
    store = BoundaryStore(allowance=dense.nbytes + 500, scratch=str(tmp_path))
    for key, block in enumerate([dense, sparse, dense, sparse]):
        store.put(key, Chunk.of(np.arange(block.shape[1]) + key, block))
    assert store.spilled_bytes > 0 and store.held <= dense.nbytes + 500
    assert len(os.listdir(tmp_path)) == 1
    for key, block in enumerate([dense, sparse, dense, sparse]):
        chunk = store.take(key)
        # stored sparse where that is smaller, in memory or spilled
        assert isinstance(chunk.values, sp.csr_matrix) == (block is sparse)
        assert np.array_equal(chunk.dense(), block)
        assert np.array_equal(chunk.ids, np.arange(block.shape[1]) + key)
    assert store.take(0) is None
    store.close()
    assert os.listdir(tmp_path) == []


def test_a_network_file_that_changes_under_a_job_is_refused(tmp_path):
    net = random_network([20, 16, 8], 4, seed=1)
    path = tmp_path / "net.npz"
    save_network(net, path)
    other = tmp_path / "other.npz"
    save_network(random_network([20, 16, 8], 5, seed=2), other)
    with NetworkBundle(path) as bundle:
        bundle.check_unchanged()
        shutil.copyfile(other, tmp_path / "tmp.npz")
        os.replace(tmp_path / "tmp.npz", path)  # replaced under the path
        with pytest.raises(InputError, match="changed, moved or shrank during the run"):
            bundle.check_unchanged()
    with NetworkBundle(other) as bundle:
        with open(other, "r+b") as fh:  # cut short in place
            fh.truncate(os.path.getsize(other) - 100)
        with pytest.raises(InputError, match="changed, moved or shrank"):
            bundle.check_unchanged()


def test_the_inputs_held_through_every_block_leave_less_room_for_the_blocks(wide, tmp_path):
    """A rank holds its inputs while every block runs: they are counted before loading, the
    blocks shrink to fit beside them, and inputs that leave no room are refused."""
    # 55 MB above the baseline this job's process measures (less than its 44 MB of weights
    # and 16 MB of buffers)
    limit = dry_run_baseline("infer", "--network", wide, "--inputs", "digits") + 55_000_000

    def blocks(inputs: str) -> int:
        dry = run_spdnn("infer", "--network", wide, "--inputs", inputs, "--memory-limit",
                        limit, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        return int(re.search(r"streaming 41 layers in (\d+) block", dry.stdout).group(1))

    rng = np.random.default_rng(0)
    for rows, name in ((40_000, "some.npz"), (360_000, "many.npz")):  # 10 MB, 92 MB
        np.savez(tmp_path / name, x_train=rng.random((rows, 64), dtype=np.float32),
                 y_train=rng.integers(0, 10, rows))
    assert blocks(f"npz:{tmp_path / 'some.npz'}") > blocks("digits")
    proc = run_spdnn("infer", "--network", wide, "--inputs", f"npz:{tmp_path / 'many.npz'}",
                     "--memory-limit", limit)
    assert_one_line_error(proc, f"--memory-limit {limit / 1e6:.2f} MB: rank 0's inputs alone "
                                "take 92.16 MB, which leaves no room for its layers")
