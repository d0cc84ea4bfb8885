"""Giving back LLVM's pages once the kernels are loaded (spdnn.kernels.residency): only clean
read-only mappings are touched, the resident set falls, and the kernels still compute the
same products afterwards."""

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
from spdnn.kernels.residency import _clean_mappings
from spdnn.model.generate import random_network
from spdnn.model.memory import SCIPY_BASELINE_BYTES, SETTLED_BYTES
from spdnn.model.plan import network_patterns
from tests.helpers import launch

SMAPS = """\
7f0000000000-7f0000100000 r--p 00000000 fd:01 42 /env/llvmlite/binding/libllvmlite.so
Rss:                 800 kB
Private_Dirty:         0 kB
Anonymous:             0 kB
7f0000100000-7f0000900000 r-xp 00100000 fd:01 42 /env/llvmlite/binding/libllvmlite.so
Rss:                4000 kB
Shared_Dirty:          0 kB
Private_Dirty:         0 kB
Anonymous:             0 kB
7f0000900000-7f0000a00000 r--p 00900000 fd:01 42 /env/llvmlite/binding/libllvmlite.so
Rss:                1024 kB
Private_Dirty:       512 kB
Anonymous:           512 kB
7f0000a00000-7f0000a10000 rw-p 00a00000 fd:01 42 /env/llvmlite/binding/libllvmlite.so
Rss:                  64 kB
Private_Dirty:         0 kB
Anonymous:             0 kB
7f0000b00000-7f0000c00000 r-xp 00000000 fd:01 43 /env/numpy/_multiarray_umath.so
Rss:                 900 kB
Private_Dirty:         0 kB
Anonymous:             0 kB
7f0000c00000-7f0000d00000 r--s 00000000 fd:01 42 /env/llvmlite/binding/libllvmlite.so
Rss:                  10 kB
Private_Dirty:         0 kB
Anonymous:             0 kB
"""


def test_only_clean_private_read_only_mappings_of_the_library_are_chosen(tmp_path):
    smaps = tmp_path / "smaps"
    smaps.write_text(SMAPS)
    # not: the relocated (dirty) read-only segment, the writable one, another library, a
    # shared mapping
    assert _clean_mappings("libllvmlite", str(smaps)) == [
        (0x7f0000000000, 0x7f0000100000), (0x7f0000100000, 0x7f0000900000)]
    # Every shared library's (once a process): numpy's code too, by the same rules.
    assert _clean_mappings(None, str(smaps)) == [
        (0x7f0000000000, 0x7f0000100000), (0x7f0000100000, 0x7f0000900000),
        (0x7f0000b00000, 0x7f0000c00000)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps is Linux's")
def test_loading_kernels_then_releasing_lowers_the_resident_set_and_kernels_still_work():
    script = textwrap.dedent("""
        import numpy as np, scipy.sparse as sp
        from spdnn import kernels
        from spdnn.kernels import products
        from spdnn.kernels.residency import release_compiler_pages

        def rss():
            for line in open('/proc/self/status'):
                if line.startswith('VmRSS:'):
                    return int(line.split()[1]) * 1024

        kernels.set_backend('numba')
        w = sp.random(300, 200, density=0.05, format='csr', dtype=np.float64, random_state=0)
        x = np.random.default_rng(0).standard_normal((200, 16))
        before = products.spmm(w, x)
        loaded = rss()
        released = release_compiler_pages()
        after_release = rss()
        again = products.spmm(w, x)
        print(released, loaded, after_release, float(np.max(np.abs(again - before))),
              float(np.max(np.abs(before - w @ x))), release_compiler_pages())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout.split()
    released, loaded, after, diff, err, later = (int(out[0]), int(out[1]), int(out[2]),
                                                 float(out[3]), float(out[4]), int(out[5]))
    assert released > 10e6  # LLVM's code and read-only data: ~70 MB where measured
    assert loaded - after > 10e6  # and it leaves the resident set
    assert diff == 0.0 and err < 1e-12  # the loaded kernels are untouched
    # The other libraries' ranges are read and released once, never kept (an address of a
    # library unloaded later could come to hold data): later calls release LLVM's alone.
    assert 0 < later < released


def test_a_job_over_the_threshold_loads_its_kernels_first_and_peaks_as_predicted(tmp_path):
    """100 MB held (3.1M float64 weights in training): the kernels load before the layers, so
    the peak is what is held plus the settled baseline (loading them last, on top of the
    layers, peaked at 402 MB against 317 predicted)."""
    net = random_network([256, 2048, 2048, 2048], [256, 512, 512], seed=0, head=10,
                         dtype="float64")
    save_network(net, tmp_path / "net.npz")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data.npz", x_train=rng.standard_normal((256, 256)),
             y_train=rng.integers(0, 10, 256))
    job = ("train", "--network", "net.npz", "--data", "npz:data.npz", "--dtype", "float64",
           "--max-steps", "2", "--batch-size", "64", "--metrics-out", "m.json")
    # Twice: the measured run loads every kernel from numba's cache, as the prediction assumes.
    # A kernel the cache lacks (compiled by no test yet, in whichever order the workers run
    # them) is compiled in the first run: 285 MB were measured once with a compile, 263 without.
    for _ in range(2):
        proc = launch(0, *job, cwd=tmp_path, cold=True)  # a new interpreter's baseline
        assert proc.returncode == 0, proc.stderr
    mem = json.loads((tmp_path / "m.json").read_text())["memory"]
    predicted, peak = mem["predicted_bytes"][0], mem["peak_bytes"][0]
    assert predicted["baseline"] == SETTLED_BYTES
    assert abs(peak - predicted["total"]) <= 0.15 * predicted["total"], (peak, predicted)


@pytest.mark.parametrize("ranks", [0, 2])
def test_a_job_on_the_scipy_kernels_peaks_as_predicted_without_numba(tmp_path, ranks):
    """SPDNN_KERNELS=scipy loads no compiler: the prediction counts that process's baseline
    (a small job peaked at 76-80 MB against 195 MB predicted when every rank was counted with
    numba's), and a limit of 100 MB, below numba's baseline, is no longer refused."""
    net = random_network([64, 256, 256], 16, seed=0, head=10)
    save_network(net, tmp_path / "net.npz")
    extra = ()
    if ranks:
        save_plan(partition_network(network_patterns(net), ranks, method="block",
                                    fingerprint=net.fingerprint()), tmp_path / "plan.npz")
        extra = ("--plan", "plan.npz")
    proc = launch(ranks, "train", "--network", "net.npz", "--data", "digits", *extra,
                  "--max-steps", "3", "--metrics-out", "m.json", "--memory-limit", "100M",
                  cwd=tmp_path, cold=True,
                  env={"SPDNN_KERNELS": "scipy"})
    assert proc.returncode == 0, proc.stderr
    mem = json.loads((tmp_path / "m.json").read_text())["memory"]
    for predicted, peak in zip(mem["predicted_bytes"], mem["peak_bytes"], strict=True):
        assert predicted["baseline"] == SCIPY_BASELINE_BYTES
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
    needs (13-18 MB and 0.15 CPU-s a rank); a kernel of the caller's own, in the same
    process, compiles as before, and the loaded kernels compute what the reference does."""
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import scipy.sparse as sp
        import spdnn.cli.thread_pools
        from spdnn.kernels import products
        from spdnn.runtime.session import warm_up
        warm_up(np.float64, training=True)
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
