"""Training beyond one rank's memory, under a real per-rank cap (a Linux memory cgroup per
rank, ``scripts/memcap.py``; as root): a network whose training state passes the cap is refused
at P = 1 with one line, from the cap alone; under the same cap per rank it trains at P = 4, and
its weights equal those of a P = 2 run under twice the cap (float64, 1e-10)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from spdnn.io.bundle import load_network, save_network
from spdnn.model.generate import random_network
from tests.helpers import MPIEXEC, ROOT, assert_one_line_error, launch

MEMCAP = ROOT / "scripts" / "memcap.py"
CAP = "300M"  # per rank: P = 1 is predicted at 347 MB, P = 4 peaks at about 265 MB


def _cgroups_refused() -> str | None:
    if os.geteuid() != 0:
        return "memory cgroups need root"
    v1 = Path("/sys/fs/cgroup/memory")
    parent = v1 if v1.is_dir() else Path("/sys/fs/cgroup")
    if not os.access(parent, os.W_OK):
        return f"{parent} is not writable (no memory cgroup controller to use here)"
    return None


pytestmark = pytest.mark.skipif(_cgroups_refused() is not None,
                                reason=str(_cgroups_refused()))


def _capped(ranks: int, cap: str, *args: object, cwd: Path):
    return launch(ranks, str(MEMCAP), cap, "--", sys.executable, "-m", "spdnn", *args,
                  module=None, cwd=cwd, timeout=240)


@pytest.mark.long
def test_a_network_over_one_ranks_cap_trains_on_four_capped_ranks(tmp_path):
    if MPIEXEC is None:
        pytest.skip("no mpiexec")
    from partition import partition
    from spdnn.io.planfile import save_plan

    net = random_network([256, 4096, 4096, 4096], [256, 512, 512], seed=0, head=10,
                         dtype="float64")  # 5.3M weights
    save_network(net, tmp_path / "net.npz")
    for parts in (2, 4):
        save_plan(partition(net, parts=parts, method="block"), tmp_path / f"plan{parts}.npz")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data.npz", x_train=rng.standard_normal((256, 256)),
             y_train=rng.integers(0, 10, 256))
    train = ["train", "--network", "net.npz", "--data", "npz:data.npz", "--dtype", "float64",
             "--epochs", "1", "--batch-size", "64", "--max-steps", "3", "--no-shuffle"]
    alone = _capped(1, CAP, *train, "--save", "one.npz", cwd=tmp_path)
    assert_one_line_error(alone, "rank 0: predicted peak", "is over the allowed 314.57 MB "
                          "(the cgroup memory limit)")
    assert not (tmp_path / "one.npz").exists()
    four = _capped(4, CAP, *train, "--plan", "plan4.npz", "--save", "four.npz", cwd=tmp_path)
    assert four.returncode == 0, four.stderr
    two = _capped(2, "600M", *train, "--plan", "plan2.npz", "--save", "two.npz", cwd=tmp_path)
    assert two.returncode == 0, two.stderr
    a, b = load_network(tmp_path / "four.npz"), load_network(tmp_path / "two.npz")
    for la, lb in zip(a.layers, b.layers):
        assert np.max(np.abs(la.weight.data - lb.weight.data)) <= 1e-10
        assert np.max(np.abs(la.bias - lb.bias)) <= 1e-10
    launch(0, str(MEMCAP), "--clean", module=None, cwd=tmp_path)
