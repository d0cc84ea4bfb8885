"""Each rank's memory as a scheduler counts it (spdnn.runtime.memory_report): the peak
proportional set size (pages shared with other processes counted by their share), the
process baseline measured once the kernels are loaded, predictions that hold with it, and the
kernels loaded without numba's compiler registries (spdnn.kernels.cache_loads)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from partition.methods import partition_network
from spdnn.io.bundle import save_network
from spdnn.io.planfile import save_plan
from spdnn.model.generate import random_network
from spdnn.model.plan import network_patterns
from tests.helpers import launch


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="smaps_rollup is Linux's")
def test_pages_shared_by_the_ranks_of_a_node_count_by_their_share(tmp_path):
    """200 MB of a shared file that this process and another one both touch (as the ranks of
    a node share their libraries and MPI's segments): a rank's figure counts its private
    pages and 1/ranks of its shared ones, so with 2 ranks on the node 100 MB of these, with
    one all of them; and its peak is lowered by as much."""
    script = textwrap.dedent(f"""
        import mmap, subprocess, sys
        from spdnn.runtime.memory_report import peak_bytes, peak_rss, share_now
        size = 200 * 2**20
        path = {str(tmp_path / "shared")!r}
        with open(path, "wb") as fh:
            fh.truncate(size)
        fh = open(path, "r+b")
        mine = mmap.mmap(fh.fileno(), size)
        mine.write(b"x" * size)
        other = subprocess.Popen([sys.executable, "-c", "import mmap, sys; "
            "f = open(sys.argv[1], 'r+b'); m = mmap.mmap(f.fileno(), 0); "
            "print(m.read().count(b'x'), flush=True); sys.stdin.read()", path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert int(other.stdout.readline()) == size  # now resident there too
        print(share_now(1) - share_now(2), peak_bytes(1) - peak_bytes(2), peak_rss() -
              peak_bytes(1))
        other.communicate("")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    half_now, half_at_peak, alone = (int(v) for v in out.stdout.split())
    assert 100 * 2**20 <= half_now < 130 * 2**20, half_now  # 100 MB and half the libraries
    assert abs(half_at_peak - half_now) < 2**20
    assert alone == 0  # one rank on the node: every shared page is its own


def test_a_job_measures_its_baseline_and_peaks_as_predicted(tmp_path):
    """100 MB held (3.1M float64 weights in training): the kernels load before the layers and
    the baseline is what the process holds then, measured; the peak is within 15% of what it
    holds plus that baseline."""
    net = random_network([256, 2048, 2048, 2048], [256, 512, 512], seed=0, head=10,
                         dtype="float64")
    save_network(net, tmp_path / "net.npz")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data.npz", x_train=rng.standard_normal((256, 256)),
             y_train=rng.integers(0, 10, 256))
    job = ("train", "--network", "net.npz", "--data", "npz:data.npz", "--dtype", "float64",
           "--max-steps", "2", "--batch-size", "64", "--metrics-out", "m.json")
    proc = launch(0, *job, cwd=tmp_path, cold=True)  # a new interpreter's baseline
    assert proc.returncode == 0, proc.stderr
    mem = json.loads((tmp_path / "m.json").read_text())["memory"]
    predicted, peak = mem["predicted_bytes"][0], mem["peak_bytes"][0]
    assert 30e6 < predicted["baseline"] < 600e6, predicted  # an interpreter with its kernels
    assert abs(peak - predicted["total"]) <= 0.15 * predicted["total"], (peak, predicted)


@pytest.mark.parametrize("ranks", [0, 2])
def test_a_job_on_the_scipy_kernels_peaks_as_predicted_without_numba(tmp_path, ranks):
    """SPDNN_KERNELS=scipy loads no compiler: the baseline each rank measures is that of a
    process without numba, so a limit of 120 MB, below a numba rank's, is not refused, and
    the peak is as predicted."""
    net = random_network([64, 256, 256], 16, seed=0, head=10)
    save_network(net, tmp_path / "net.npz")
    extra = ()
    if ranks:
        save_plan(partition_network(network_patterns(net), ranks, method="block",
                                    fingerprint=net.fingerprint()), tmp_path / "plan.npz")
        extra = ("--plan", "plan.npz")
    proc = launch(ranks, "train", "--network", "net.npz", "--data", "digits", *extra,
                  "--max-steps", "3", "--metrics-out", "m.json", "--memory-limit", "120M",
                  cwd=tmp_path, cold=True,
                  env={"SPDNN_KERNELS": "scipy"})
    assert proc.returncode == 0, proc.stderr
    mem = json.loads((tmp_path / "m.json").read_text())["memory"]
    for predicted, peak in zip(mem["predicted_bytes"], mem["peak_bytes"], strict=True):
        assert predicted["baseline"] < 120e6, predicted
        assert abs(peak - predicted["total"]) <= 0.15 * predicted["total"], (peak, predicted)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork's rusage is Linux's")
def test_the_peak_a_process_reports_is_its_own_not_its_parents():
    """``ru_maxrss`` keeps the resident set of the process a job was forked from; the peak
    reported is the job's own (``VmHWM``)."""
    child = ("from spdnn.runtime.memory_report import peak_rss; import resource; "
             "print(peak_rss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    parent = textwrap.dedent(f"""
        import subprocess, sys
        import numpy as np
        big = np.ones(400 * 2**20 // 8)  # 400 MiB resident in the parent
        out = subprocess.run([sys.executable, "-c", {child!r}], capture_output=True,
                             text=True, check=True).stdout
        print(out, big[-1])
    """)
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True,
                         check=True).stdout.split()
    own, inherited = int(out[0]), int(out[1])
    assert own < 150e6, (own, inherited)  # an interpreter with numpy and scipy: ~50 MB (here
    # ru_maxrss said 440 MB)


def test_kernels_load_without_numbas_registries_and_the_callers_numba_is_untouched():
    """spdnn's kernels load from numba's cache without the implementations only compiling
    needs (private memory and start-up time of every rank); a kernel of the caller's own, in
    the same process, compiles as before, and the loaded kernels compute what the reference
    does."""
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import scipy.sparse as sp
        import spdnn.cli.thread_pools
        from spdnn.kernels import products
        from spdnn.kernels.loading import load_kernels
        load_kernels(np.float64)
        lean = "numba.np.arraymath" not in sys.modules
        w = sp.random(64, 48, density=0.2, format="csr", random_state=0)
        x = np.random.default_rng(0).random((48, 5))
        err = float(np.abs(products.spmm(w, x) - w @ x).max())
        import numba
        @numba.njit(cache=False)
        def mine(a):
            return np.sum(np.sqrt(a))  # needs the registries: compiles as it would anyway
        print(lean, err < 1e-12, mine(np.full(4, 4.0)))
        """)
    # Twice: a kernel missing from the cache is compiled in the first run, which loads the
    # registries (compiling needs them), as it should.
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True", "8.0"], proc.stdout
