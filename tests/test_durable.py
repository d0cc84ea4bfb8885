"""Files that survive a crash: every file is flushed to the disk before its rename and the
directory after it; of several runs that find the same stale checkpoint lock, exactly one
takes it."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from spdnn.errors import InputError
from spdnn.io import atomic
from spdnn.io.bundle import save_network
from spdnn.io.planfile import save_plan
from spdnn.model.generate import random_network
from spdnn.model.plan import Plan
from spdnn.runtime import checkpoint


def test_a_file_is_flushed_before_its_rename_and_the_directory_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        target = os.readlink(f"/proc/self/fd/{fd}")
        events.append(("fsync", "dir" if os.path.isdir(target) else os.path.basename(target)))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("rename", os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    net = random_network([6, 5, 3], 2, seed=0)
    save_network(net, tmp_path / "net.npz")
    save_plan(Plan(1, tuple(np.zeros(n, np.int32) for n in net.sizes), {}), tmp_path / "p.npz")
    atomic.write_text(tmp_path / "m.json", "{}")
    for name in ("net.npz", "p.npz", "m.json"):
        i = events.index(("rename", name))
        assert events[i - 1][0] == "fsync" and events[i - 1][1].startswith(f".{name}.")
        assert events[i + 1] == ("fsync", "dir")
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _starter(directory, barrier, results):
    barrier.wait()
    try:
        checkpoint.take_lock(directory)
        results.put(("took", os.getpid()))
    except InputError as exc:
        results.put(("refused", str(exc)))


@pytest.mark.parametrize("starters", [2, 4])
def test_of_runs_finding_one_stale_lock_exactly_one_takes_it(tmp_path, monkeypatch, starters):
    """The race the takeover must survive: every starter reads the dead run's lock, then waits
    (0.2 s) before replacing it; without the serialised re-check all of them would hold it."""
    monkeypatch.setattr(checkpoint, "_TAKEOVER_PAUSE", 0.2)
    (tmp_path / "lock").write_text(f"{socket.gethostname()} {_dead_pid()}\n")
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(starters), ctx.Queue()
    procs = [ctx.Process(target=_starter, args=(tmp_path, barrier, results))
             for _ in range(starters)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
    took = [o for o in outcomes if o[0] == "took"]
    assert len(took) == 1, outcomes
    assert all("another run" in o[1] for o in outcomes if o[0] == "refused")
    holder = (tmp_path / "lock").read_text().split()
    assert holder == [socket.gethostname(), str(took[0][1])]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lock"]


def test_a_live_lock_is_refused_and_a_stale_one_taken(tmp_path):
    (tmp_path / "lock").write_text(f"{socket.gethostname()} {os.getpid()}\n")
    with pytest.raises(InputError, match=f"another run \\(process {os.getpid()}"):
        checkpoint.take_lock(tmp_path)
    (tmp_path / "lock").write_text(f"{socket.gethostname()} {_dead_pid()}\n")
    assert checkpoint.take_lock(tmp_path) is False
    assert (tmp_path / "lock").read_text().split()[1] == str(os.getpid())
    assert checkpoint.take_lock(tmp_path / "new") is True



UNWRITABLE = "/proc"  # its permission bits say writable to root, yet no file can be made there


@pytest.mark.skipif(not os.path.isdir(f"{UNWRITABLE}/self"), reason="needs Linux's /proc")
def test_an_unwritable_output_directory_is_refused_before_the_run_not_after(tmp_path):
    """Permission bits pass /proc (and a read-only mount, for root): the check makes a file
    there instead, before any work; a write that fails anyway is one line, not a traceback
    (``--metrics-out /proc/m.json`` trained, then ended in FileNotFoundError)."""
    from spdnn.io.paths import check_outputs
    from tests.helpers import assert_one_line_error, run_cli

    with pytest.raises(InputError, match="--save: output directory /proc is not writable"):
        check_outputs([("--save", f"{UNWRITABLE}/x.npz")])
    with pytest.raises(InputError, match="--checkpoint-dir: /proc is not writable"):
        check_outputs([], [("--checkpoint-dir", f"{UNWRITABLE}/ckpt")])
    with pytest.raises(InputError, match="cannot write the metrics"):
        atomic.write_text(f"{UNWRITABLE}/x.json", "{}", "the metrics")
    check_outputs([("--save", str(tmp_path / "x.npz"))], [("--checkpoint-dir", str(tmp_path))])
    assert list(tmp_path.iterdir()) == []  # the probe is gone
    assert_one_line_error(run_cli("generate", "random", "--sizes", "12,4", "--fan-in", "2",
                                  "-o", f"{UNWRITABLE}/n.npz"), "/proc is not writable")
    save_network(random_network([12, 8, 4], 3, seed=0), tmp_path / "net.npz")
    assert_one_line_error(run_cli(tmp_path / "net.npz", "-P", "2", "-o", f"{UNWRITABLE}/p.npz",
                                  module="partition"), "/proc is not writable")


def test_taking_the_lock_sweeps_only_the_temporaries_spdnn_names(tmp_path):
    """A killed run's temporaries are removed; a user's own ``.*.tmp`` files are not."""
    from spdnn.io.atomic import temporary
    from spdnn.runtime.checkpoint import take_lock

    ours = [temporary(tmp_path, n) for n in ("manifest.json", "step000000012-rank00003.npz",
                                             "step000000012-replica0001-rank00000.npz",
                                             "step000000012-critical.npz")]
    theirs = [tmp_path / ".notes.txt.abc.tmp", tmp_path / ".manifest.json.tmp",
              tmp_path / ".step1-rank0.npz.x.tmp"]
    for p in theirs:
        p.write_text("keep me")
    take_lock(tmp_path)
    assert not any(os.path.exists(p) for p in ours)
    assert all(p.read_text() == "keep me" for p in theirs)


def test_outputs_that_clash_with_each_other_or_an_input_are_refused(tmp_path):
    """Two outputs naming one file, or an output naming an input (through a symlink too),
    end in one line before any work, and the input is left as it was."""
    from spdnn.io.bundle import save_network
    from tests.helpers import assert_one_line_error, launch, run_cli, small_network

    net = tmp_path / "net.npz"
    save_network(small_network(), net)
    before = net.read_bytes()
    (tmp_path / "alias.npz").symlink_to(net)
    assert_one_line_error(run_cli(net, "-P", "2", "-o", tmp_path / "alias.npz",
                                  module="partition"), "-o names the input (NETWORK)")
    assert_one_line_error(run_cli("convert", "network", net, "--to", "network", "-o", net),
                          "-o names the input")
    assert_one_line_error(launch(0, "train", "--network", net, "--data", "digits",
                                 "--save", tmp_path / "m.json", "--metrics-out",
                                 tmp_path / "m.json"),
                          "--save and --metrics-out name the same file")
    assert net.read_bytes() == before and not (tmp_path / "m.json").exists()


def test_a_symlink_is_written_through_and_a_pipe_written_into(tmp_path):
    """An output that is a symlink: its target gets the file, the link stays a link (a rename
    over it would replace the link); a FIFO (as /dev/null or /dev/stdout, a device): the
    output is written into it, and it stays a FIFO. Both the library writer and a job."""
    import json
    import stat
    import threading

    from tests.helpers import launch, small_network

    (tmp_path / "link.npz").symlink_to("target.npz")
    save_network(small_network(), tmp_path / "link.npz")
    assert (tmp_path / "link.npz").is_symlink()
    assert (tmp_path / "target.npz").stat().st_size > 0
    os.mkfifo(tmp_path / "fifo")
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append((tmp_path / "fifo").read_bytes()))
    reader.start()
    save_network(random_network([64, 16], 4, seed=0, head=10), tmp_path / "net.npz")
    (tmp_path / "out.npz").symlink_to("trained.npz")
    proc = launch(0, "train", "--network", tmp_path / "net.npz", "--data", "digits",
                  "--epochs", "1", "--metrics-out", tmp_path / "fifo", "--save",
                  tmp_path / "out.npz")
    if proc.returncode:  # the reader waits for a writer
        with open(tmp_path / "fifo", "wb"):
            pass
    reader.join(60)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISFIFO(os.stat(tmp_path / "fifo").st_mode)
    assert json.loads(got[0])["epochs"]
    assert (tmp_path / "out.npz").is_symlink() and (tmp_path / "trained.npz").stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "fifo", "link.npz", "net.npz", "out.npz", "target.npz", "trained.npz"]


@pytest.mark.parametrize("sink, code, line", [("| head -c 20 >/dev/null", 0, None),
                                              ("> /dev/full", 2, "No space left on device")])
def test_a_standard_output_that_fails_loses_no_file(tmp_path, sink, code, line):
    """A closed pipe ends the command quietly, /dev/full with one line; the saved network is
    written either way, and no traceback is printed."""
    import subprocess
    import sys

    from tests.helpers import _environment

    cmd = (f"{sys.executable} -m spdnn generate random --sizes 64,32 --fan-in 8 --head 10 "
           f"-o {tmp_path}/n.npz >/dev/null && {sys.executable} -m spdnn train --network "
           f"{tmp_path}/n.npz --epochs 2 --save {tmp_path}/t.npz {sink}; "
           "echo \"${PIPESTATUS[0]}\" >&2")
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120,
                          env=_environment(None, 120))
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert err[-1] == str(code), proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    assert err[:-1] == ([] if line is None else [err[0]]) and (line is None or line in err[0])
    assert (tmp_path / "t.npz").is_file()


@pytest.mark.parametrize("failing", ["--metrics-out", "--save-plan"])
def test_an_output_that_cannot_be_written_takes_the_others_with_it(tmp_path, failing):
    """--save, --save-plan and --metrics-out appear together or not at all: a later one that
    cannot be written (/dev/full) leaves no --save file behind, one line, exit 2."""
    from tests.helpers import assert_one_line_error, run_spdnn

    save_network(random_network([64, 32, 10], 8, seed=0), tmp_path / "n.npz")
    outputs = {"--metrics-out": tmp_path / "m.json", "--save-plan": tmp_path / "p.npz"}
    outputs[failing] = "/dev/full"
    proc = run_spdnn("train", "--network", tmp_path / "n.npz", "--data", "digits", "--epochs",
                     "1", "--max-steps", "3", "--sparse-update", "set", "--update-every", "2",
                     "--save", tmp_path / "t.npz", *[a for kv in outputs.items() for a in kv])
    assert_one_line_error(proc, "/dev/full", "No space left on device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n.npz"]
    proc = run_spdnn("train", "--network", tmp_path / "n.npz", "--data", "digits", "--epochs",
                     "1", "--max-steps", "3", "--save", tmp_path / "t.npz", "--metrics-out",
                     tmp_path / "m.json")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "n.npz", "t.npz"]
