"""``--memory-limit``: parsing, the cgroup's limit as the default, and the one-line refusals
of the command (a limit that cannot be parsed, one below a rank's baseline, one the job's
prediction passes), each with exit code 2 and nothing written; ``--dry-run`` prints the
prediction and exits 0."""

from __future__ import annotations

import numpy as np
import pytest

from spdnn.comm.memlimit import cgroup_limit, parse_bytes
from spdnn.errors import SpdnnError
from spdnn.io.bundle import save_network
from tests.helpers import dry_run_baseline, launch, small_network


@pytest.mark.parametrize("text, expected", [
    ("1073741824", 2**30), ("4G", 4 * 2**30), ("512M", 512 * 2**20), ("1.5G", 3 * 2**29),
    ("64k", 64 * 2**10), ("2GiB", 2 * 2**30), ("300MB", 300 * 2**20), ("none", 0),
    (" 8G ", 8 * 2**30)])
def test_byte_counts_with_suffixes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "12X", "-1G", "G", "1e9", "0", "0.1", "1.2.3G", "inf"])
def test_bad_byte_counts_are_refused(text):
    with pytest.raises(SpdnnError, match="memory_limit .*: (not a number|must be at least)"):
        parse_bytes(text)


def test_the_cgroup_limit_is_found_in_v1_and_v2(tmp_path):
    proc = tmp_path / "cgroup"
    root = tmp_path / "fs"
    (root / "memory" / "job7").mkdir(parents=True)
    (root / "memory" / "job7" / "memory.limit_in_bytes").write_text("1073741824\n")
    proc.write_text("12:cpu,cpuacct:/job7\n9:memory:/job7\n")
    assert cgroup_limit(proc, root) == 2**30
    (root / "memory" / "job7" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_limit(proc, root) is None  # v1's "unlimited"
    (root / "slurm" / "step0").mkdir(parents=True)
    (root / "slurm" / "step0" / "memory.max").write_text("536870912\n")
    proc.write_text("0::/slurm/step0\n")
    assert cgroup_limit(proc, root) == 2**29
    (root / "slurm" / "step0" / "memory.max").write_text("max\n")
    assert cgroup_limit(proc, root) is None
    assert cgroup_limit(tmp_path / "absent", root) is None


def test_a_limit_set_on_an_ancestor_cgroup_counts(tmp_path):
    from spdnn.comm.memlimit import cgroup_memory

    proc, root = tmp_path / "cgroup", tmp_path / "fs"
    (root / "memory" / "job7" / "step0").mkdir(parents=True)
    (root / "memory" / "job7" / "step0" / "memory.limit_in_bytes").write_text(
        "9223372036854771712\n")  # the step unlimited, the job limited (Slurm's layout)
    (root / "memory" / "job7" / "memory.limit_in_bytes").write_text("2147483648\n")
    proc.write_text("9:memory:/job7/step0\n")
    assert cgroup_memory(proc, root) == (2**31, str(root / "memory" / "job7"))


@pytest.fixture(scope="module")
def network(tmp_path_factory):
    path = tmp_path_factory.mktemp("budget") / "net.npz"
    save_network(small_network((64, 40, 10), fan_in=8, seed=2), path)
    return path


@pytest.mark.parametrize("limit, message", [
    ("12X", "argument --memory-limit: '12X': not a number of bytes"),
    ("20M", "--memory-limit 20.97 MB is below this rank's baseline of "),
    ("baseline + 20 MB", "rank 0: predicted peak "),  # above the baseline, below the job
])
def test_a_limit_the_job_cannot_keep_ends_it_with_one_line(network, tmp_path, limit, message):
    """The baseline is each process's own, measured: the limit between it and the job is
    set from what a dry run of the same job measured (the job holds 51 MB of data)."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data.npz", x_train=rng.random((200_000, 64), dtype=np.float32),
             y_train=rng.integers(0, 10, 200_000))
    job = ("train", "--network", network, "--data", f"npz:{tmp_path / 'data.npz'}",
           "--epochs", "1")
    if limit.startswith("baseline"):
        limit = str(dry_run_baseline(*job) + 20_000_000)
    saved = tmp_path / "trained.npz"
    proc = launch(0, *job, "--save", saved, "--memory-limit", limit)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not saved.exists()


def test_a_dry_run_prints_the_prediction_and_runs_nothing(network, tmp_path):
    saved = tmp_path / "trained.npz"
    proc = launch(0, "train", "--network", network, "--data", "digits", "--batch-size", "32",
                  "--save", saved, "--dry-run", "--memory-limit", "1G")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "predicted peak memory per rank (training at batch 32):"
    assert lines[1].split() == ["rank", "weights", "training", "buffers", "data", "baseline",
                                "total", "limit"]
    # the digits' 1,797 x 64 float32 values, counted before they are read
    assert lines[2].split()[0] == "0" and lines[2].split()[7:9] == ["460.03", "kB"]
    assert lines[2].split()[-2:] == ["1.07", "GB"]
    assert not saved.exists() and "epoch" not in proc.stdout


@pytest.mark.parametrize("value", [-1, 1.5, True, "4G"])
def test_run_options_refuse_a_limit_that_is_not_a_byte_count(value):
    from spdnn.model.options import RunOptions, check_run_options

    with pytest.raises(SpdnnError, match="memory_limit must be a number of bytes"):
        check_run_options(RunOptions(memory_limit=value))


def test_the_api_takes_spdnn_threads_unless_told_otherwise(monkeypatch):
    from spdnn.model.options import RunOptions, check_run_options, kernel_threads

    monkeypatch.delenv("SPDNN_THREADS", raising=False)
    assert kernel_threads(RunOptions()) == 1
    monkeypatch.setenv("SPDNN_THREADS", "2")
    assert kernel_threads(RunOptions()) == 2
    assert kernel_threads(RunOptions(threads=1)) == 1
    for bad in (0, 1.5, True):
        with pytest.raises(SpdnnError, match="threads must be a positive integer"):
            check_run_options(RunOptions(threads=bad))
