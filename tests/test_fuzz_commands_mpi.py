"""Seeded mutants of every file a command reads, run through the command's entry point on every
rank of the job, under 1, 2, 3 and 4 ranks (and Open MPI) by the test command.

- The distributed commands (``spdnn train`` and ``spdnn infer``: network, plan, data,
  checkpoint manifest and rank file, Graph Challenge inputs and truth, calibration, cluster):
  each mutant runs, or ends with exit code 2 on every rank and one line on rank 0 naming a file
  of the case, nothing on the others; an error found by one rank alone would abort the job,
  which fails the run.
- The serial commands (every ``spdnn-partition`` command, ``spdnn convert``, ``generate
  prune``, ``plot``), each rank running its own copy as ``mpirun -n P CMD`` would: exit 0, or
  2 with one line naming a file of the case, no traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import ROOT, small_network
from tests.test_fuzz import mutate

pytestmark = pytest.mark.mpi
MUTANTS = 6
SERIAL_MUTANTS = 4
SIZES = (12, 9, 7, 4)


@pytest.fixture
def case_files(comm, mpi_tmp_path) -> Path:
    """A network, its plan for this job, data, a checkpoint, Graph Challenge inputs and the
    cost model's files, written by rank 0."""
    d = mpi_tmp_path / "fuzz"
    if comm.rank == 0:
        from partition.api import partition
        from spdnn.api import train
        from spdnn.io.bundle import save_network
        from spdnn.io.formats import write_categories, write_triples
        from spdnn.io.planfile import save_plan
        from spdnn.model.options import RunOptions, TrainOptions

        d.mkdir()
        net = small_network(SIZES, dtype="float64")
        save_network(net, d / "net.npz")
        rng = np.random.default_rng(0)
        np.savez(d / "data.npz", x_train=rng.standard_normal((24, SIZES[0])),
                 y_train=rng.integers(0, SIZES[-1], 24))
        # A checkpoint written by a one-rank run (resumable on any P).
        from spdnn.comm.mpi import Communicator

        with Communicator.self_only() as alone:
            train(d / "net.npz", data=f"npz:{d / 'data.npz'}", run=RunOptions(dtype="float64"),
                  options=TrainOptions(epochs=1, batch_size=8, checkpoint_dir=d / "ck",
                                       max_steps=2), comm=alone)
        for p in (1, 2, 3, 4):
            save_plan(partition(net, parts=p, method="cyclic"), d / f"plan{p}.npz")
        import scipy.sparse as sp

        from spdnn.api import infer

        images = sp.random(5, SIZES[0], density=0.4, random_state=1, format="csr")
        write_triples(d / "images.tsv", images)
        with Communicator.self_only() as alone:
            found = infer(d / "net.npz", inputs=str(d / "images.tsv"), comm=alone)
        write_categories(d / "truth.tsv", found.categories)
        shutil.copy(ROOT / "docs" / "calibration-2core-vm.json", d / "machine.json")
        shutil.copy(ROOT / "docs" / "cluster-hdr-infiniband.json", d / "cluster.json")
    comm.barrier()
    return d


def _cases(d: Path, ranks: int) -> list[tuple[str, list[object]]]:
    """(file to mutate, the command that reads it)."""
    plan = ["--plan", d / f"plan{ranks}.npz"] if ranks > 1 else []
    data = ["--data", f"npz:{d / 'data.npz'}", "--epochs", "1", "--batch-size", "8",
            "--dtype", "float64"]
    train = ["train", "--network", d / "net.npz", *plan, *data]
    return [
        ("net.npz", train),
        ("data.npz", train),
        ("ck/manifest.json", [*train, "--resume", d / "ck", "--epochs", "2"]),
        ("ck/step000000002-rank00000.npz", [*train, "--resume", d / "ck", "--epochs", "2"]),
        ("machine.json", ["train", "--network", d / "net.npz", "--plan", d / f"plan{ranks}.npz",
                          "--replicas", "auto", "--calibration", d / "machine.json", *data]),
        ("cluster.json", ["train", "--network", d / "net.npz", "--replicas", "auto",
                          "--calibration", d / "machine.json", "--cluster",
                          d / "cluster.json", *data]),
        ("net.npz", ["infer", "--network", d / "net.npz", *plan, "--inputs", d / "images.tsv"]),
        ("images.tsv", ["infer", "--network", d / "net.npz", *plan,
                        "--inputs", d / "images.tsv"]),
        ("truth.tsv", ["infer", "--network", d / "net.npz", *plan, "--inputs",
                       d / "images.tsv", "--truth", d / "truth.tsv"]),
        (f"plan{ranks}.npz" if ranks > 1 else "plan1.npz",
         ["infer", "--network", d / "net.npz", "--plan", d / f"plan{ranks}.npz",
          "--inputs", f"npz:{d / 'data.npz'}"]),
    ]


def _mutants(comm, target: Path, seed: int, count: int):  # noqa: ANN001, ANN202
    """Rank 0 writes ``count`` seeded mutants of ``target`` in turn (every rank waits for each
    before it is yielded, and for every rank to be done with it); the valid file comes back."""
    valid = target.read_bytes() if comm.rank == 0 else b""
    rng = np.random.default_rng(seed)
    for m in range(count):
        if comm.rank == 0:
            target.write_bytes(mutate(valid, rng))
        comm.barrier()
        yield m
        comm.barrier()
    if comm.rank == 0:
        target.write_bytes(valid)
    comm.barrier()


def _run(argv: list[object]) -> tuple[int, str]:
    from spdnn.cli.parser import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, err.getvalue()


def test_mutated_inputs_of_the_distributed_commands(comm, case_files):
    d = case_files
    failures = []
    refused = total = 0
    for i, (name, argv) in enumerate(_cases(d, comm.size)):
        for m in _mutants(comm, d / name, 1000 + i, MUTANTS):
            code, err = _run(argv)
            lines = [ln for ln in err.splitlines() if ln.strip()]
            verdicts = comm.allgather((code, lines))
            where = f"{name} mutant {m} ({' '.join(map(str, argv[:1]))})"
            if {c for c, _ in verdicts} - {0, 2} or len({c for c, _ in verdicts}) > 1:
                failures.append(f"{where}: exit codes {[c for c, _ in verdicts]}: {verdicts}")
            elif verdicts[0][0] == 2:
                refused += 1
                first = verdicts[0][1]
                # The line names a file of the case, or says the mutant's values diverged.
                if len(first) != 1 or "Traceback" in "".join(first) or \
                        not first[0].startswith("spdnn: error: ") or \
                        (str(d) not in first[0] and "non-finite" not in first[0]):
                    failures.append(f"{where}: rank 0 printed {first}")
                if any(lines for _, lines in verdicts[1:]):
                    failures.append(f"{where}: other ranks printed {verdicts[1:]}")
            total += 1
    assert not failures, "\n".join(failures[:8])
    # The mutations reach the error paths: most mutants are refused, as they should be.
    assert refused >= total // 3, f"only {refused} of {total} mutants were refused"


def test_every_case_reads_a_valid_file_cleanly(comm, case_files):
    """The cases themselves run on the valid files (so a mutant's error is the mutant's)."""
    for name, argv in _cases(case_files, comm.size):
        code, err = _run(argv)
        assert (code, err) == (0, ""), (name, argv, err)
    if comm.rank == 0:
        json.loads((case_files / "ck" / "manifest.json").read_text())


def _serial_cases(d: Path, rank: int) -> list[tuple[str, str, list[object]]]:
    """(file to mutate, module, the command that reads it); outputs are per rank."""
    out = d / f"out{rank}"
    net = d / "net.npz"
    return [
        ("net.npz", "partition", [net, "-P", "2", "-o", out / "p.npz", "--quiet"]),
        ("net.npz", "partition", ["export", net, "-o", out / "n.hgr"]),
        ("plan2.npz", "partition", ["stats", net, d / "plan2.npz"]),
        ("net.hgr.part.2", "partition", ["import", net, d / "net.hgr.part.2", "-P", "2", "-o",
                                         out / "i.npz"]),
        ("machine.json", "partition", ["model", net, "--plans", d / "plan2.npz",
                                       "--batch-size", "8", "--calibration", d / "machine.json"]),
        ("cluster.json", "partition", ["model", net, "--plans", d / "plan2.npz",
                                       "--batch-size", "8", "--calibration", d / "machine.json",
                                       "--cluster", d / "cluster.json", "--replicas", "1,2"]),
        ("net.npz", "spdnn", ["convert", "network", net, "--to", "mtx", "-o", out / "mtx"]),
        ("layer1.mtx", "spdnn", ["convert", "mtx", "--dtype", "float32",
                                 d / "layer1.mtx", "-o", out / "c.npz"]),
        ("gc/n12-l1.tsv", "spdnn", ["convert", "graphchallenge", "--dtype", "float32",
                                    d / "gc", "--bias", "-0.3",
                                    "-o", out / "g.npz"]),
        ("model.safetensors", "spdnn", ["convert", "safetensors", d / "model.safetensors",
                                        "--activations", "relu", "-o", out / "s.npz"]),
        ("dense.npz", "spdnn", ["generate", "prune", "--weights", d / "dense.npz",
                                "--density", "0.5", "-o", out / "pr.npz"]),
        ("metrics.json", "spdnn", ["plot", d / "metrics.json", "-o", out / "m.svg"]),
    ]


@pytest.fixture
def serial_files(comm, case_files) -> Path:
    d = case_files
    if comm.rank == 0:
        from spdnn.io.bundle import load_network
        from spdnn.io.formats import write_mtx
        from spdnn.io.graphchallenge import write_graphchallenge
        from spdnn.io.safetensors import write_safetensors
        from spdnn.model.generate import random_network

        net = load_network(d / "net.npz")
        write_mtx(d / "layer1.mtx", net.layers[0].weight)
        write_graphchallenge(random_network([12, 12], 3, seed=0), d / "gc")  # square layers
        write_safetensors(net, d / "model.safetensors", pruned=True)
        rng = np.random.default_rng(3)
        np.savez(d / "dense.npz", W1=rng.standard_normal((8, 12)), W2=rng.standard_normal((4, 8)))
        np.savetxt(d / "net.hgr.part.2", np.arange(sum(net.sizes)) % 2, fmt="%d")
        (d / "metrics.json").write_text(json.dumps({"epochs": [
            {"epoch": 1, "loss": 1.0, "train_accuracy": 0.5, "samples_per_second": 10.0}]}))
    comm.barrier()
    (d / f"out{comm.rank}").mkdir(exist_ok=True)
    return d


def _run_serial(module: str, argv: list[object]) -> tuple[int, str]:
    from tests.helpers import run_cli

    proc = run_cli(*argv, module=module)
    return proc.returncode, proc.stderr


def test_mutated_inputs_of_the_serial_commands(comm, serial_files):
    pytest.importorskip("matplotlib")
    d = serial_files
    failures = []
    cases = _serial_cases(d, comm.rank)
    for i, (name, module, argv) in enumerate(cases):
        code, err = _run_serial(module, argv)
        valid_runs = comm.allgather((code, err[-300:]))
        if any(c != 0 for c, _ in valid_runs):  # decided alike on every rank: no rank waits
            failures.append(f"{name} ({module} {argv[0]}), valid file: {valid_runs}")
            continue
        for m in _mutants(comm, d / name, 2000 + i, SERIAL_MUTANTS):
            code, err = _run_serial(module, argv)
            lines = [ln for ln in err.splitlines() if ln.strip()]
            verdicts = comm.allgather((code, lines, "Traceback" in err))
            where = f"{name} mutant {m} ({module} {argv[0]})"
            codes = {c for c, _, _ in verdicts}
            if len(codes) != 1 or codes - {0, 2}:
                failures.append(f"{where}: exit codes {[c for c, _, _ in verdicts]}: {err[-300:]}")
            elif codes == {2}:
                # Rank 0 prints the one line (spdnn's other ranks stay quiet under a launcher,
                # spdnn-partition's print theirs): it names a file of the case.
                first = verdicts[0][1]
                if len(first) != 1 or str(d) not in first[0] or \
                        any(tb or len(ls) > 1 for _, ls, tb in verdicts):
                    failures.append(f"{where}: printed {[ls for _, ls, _ in verdicts]}")
    everyone = comm.allgather(failures)
    assert not any(everyone), "\n".join(f for fs in everyone for f in fs[:4])
