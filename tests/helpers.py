"""Small builders shared by the tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from spdnn.model.generate import random_network
from spdnn.model.network import Network

ROOT = Path(__file__).resolve().parent.parent


def find_mpiexec() -> str | None:
    """The MPI launcher a user would run: ``SPDNN_MPIEXEC`` when set, else the one beside this
    Python (a virtual environment's), else ``mpiexec`` on PATH; None when there is none."""
    explicit = os.environ.get("SPDNN_MPIEXEC")
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    return shutil.which("mpiexec")


MPIEXEC = find_mpiexec()
NO_MPIEXEC = "no MPI launcher: none beside this Python, none on PATH, SPDNN_MPIEXEC unset"


def small_network(sizes=(12, 9, 7, 4), fan_in=4, seed=0, dtype="float64", cap=None,
                  output_activation="linear", bias_scale=0.1) -> Network:
    """A random sparse network with random nonzero biases."""
    net = random_network(list(sizes), fan_in, seed=seed, cap=cap, dtype=dtype)
    rng = np.random.default_rng(seed + 1000)
    for layer in net.layers:
        layer.bias[:] = rng.standard_normal(layer.n_out) * bias_scale
    return Network(net.layers, cap=cap, output_activation=output_activation)


def run_spdnn(*args: str, cwd: Path | None = None, timeout: float = 300,
              module: str = "spdnn") -> subprocess.CompletedProcess:
    """Run ``python -m spdnn ARGS`` (or another module) and capture its output."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=env)


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    """Exit code 2, one line on stderr containing every fragment, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])
