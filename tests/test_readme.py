"""The README's and the docs pages' shell blocks run as written: every ```bash block that does
not need ``../shared`` runs, in order (the README, then the pages of its "Read on" list), in one
empty directory, with the commands a user has after ``source .venv/bin/activate`` (``spdnn``,
``spdnn-partition``, ``mpirun``, ``python``). The README's Python example runs under plain
``python`` and ``mpirun -n 2 python`` in an empty directory. The ```console blocks run too,
each printing the lines the page shows (docs/network.md's ``spdnn emulate``, where namespaces
are permitted). Every ``spdnn.``/``partition.`` name the pages and the code's docstrings
give exists."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import ROOT, launch

BIN = Path(sys.executable).parent
# The test command cannot run inside its own suite; the main job runs from the installed wheel
# in the test command (scripts/wheel_check.sh, which checks what it prints).
NOT_HERE = {"bash scripts/test.sh", "bash scripts/main.sh"}


# The pages whose blocks run after the README's, in the order of its "Read on" list.
PAGES = ("running", "recipes", "partitioner", "formats", "failures", "sparse-exchange", "lossy",
         "cost-model", "cluster", "network", "architecture")


def blocks(language: str, pages: bool = True) -> list[str]:
    texts = [(ROOT / "README.md").read_text()]
    if pages:
        texts += [(ROOT / "docs" / f"{page}.md").read_text() for page in PAGES]
    return [b for text in texts for b in re.findall(rf"^```{language}\n(.*?)^```", text,
                                                     re.S | re.M)]


def shell_blocks() -> list[str]:
    return blocks("bash")


def runnable_blocks() -> list[str]:
    return [b for b in shell_blocks() if "../shared" not in b and b.strip() not in NOT_HERE]


def user_env() -> dict[str, str]:
    missing = [c for c in ("spdnn", "spdnn-partition", "mpirun") if not (BIN / c).exists()]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed beside {sys.executable} "
                    "(run the suite through scripts/test.sh)")
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(ROOT)}


def test_the_readme_has_the_blocks_this_test_expects():
    blocks = shell_blocks()
    assert [b.strip() for b in blocks[:2]] == ["bash scripts/main.sh", "bash scripts/test.sh"]
    runnable = runnable_blocks()
    # The distributed run, the replicas, the partitioner and the one-process commands.
    assert len(runnable) >= 4
    joined = "\n".join(runnable)
    for command in ("mpirun -n 4 spdnn train", "--resume", "spdnn infer", "--replicas 2",
                    "spdnn-partition import", "spdnn convert safetensors", "spdnn plot",
                    "spdnn calibrate", "spdnn-partition model", "--replicas auto",
                    "--compress sidco", "--critical-set"):
        assert command in joined, command


@pytest.mark.timeout(900)  # the blocks include spdnn calibrate: minutes on a slow 2-core host
@pytest.mark.long(0)
def test_readme_blocks_run_as_written(tmp_path):
    env = user_env()
    # The example cluster description is named by its path in the repository.
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "cluster-hdr-infiniband.json", tmp_path / "docs")
    for block in runnable_blocks():
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"block failed:\n{block}\n{proc.stdout[-3000:]}" \
                                     f"\n{proc.stderr[-3000:]}"
    # spdnn calibrate on 2 ranks (docs/cost-model.md): a complete file, the network measured.
    from spdnn.cost.machine import load_calibration

    cal = load_calibration(tmp_path / "machine.json")
    assert cal.ranks == 2 and set(cal.kernels) == {"float32"} and cal.network is not None
    assert all(v >= 0 for v in cal.runtime.values()), cal.runtime
    assert all(cal.runtime[k] > 0 for k in ("layer_forward_s", "layer_backward_s", "message_s",
                                             "update_ns_per_value"))
    assert np.all(cal.table("float32").dense.ns["forward"] > 0)  # dense layers (BLAS)
    assert len(cal.network.pingpong_bytes) > 1 and len(cal.network.allreduce_bytes) > 1
    # What the blocks promise to leave behind.
    for name in ("trained.npz", "plan4.npz", "plan2.npz", "imported8.npz", "train1.png",
                 "machine.json", "model.json",
                 "from_mtx.npz", "from_torch.npz", "pruned.npz", "rx1024.npz"):
        assert (tmp_path / name).stat().st_size > 0, name


@pytest.mark.parametrize("ranks", [0, 2])
def test_the_python_example_runs_under_plain_python_and_two_ranks(tmp_path, ranks):
    """Under plain ``python`` (one rank, a plan of one part) and ``mpirun -n 2 python``."""
    env = user_env()
    example = blocks("python", pages=False)[0]
    (tmp_path / "example.py").write_text(example)
    # cold: a new interpreter, as a user's (the warm server keeps mpi4py.MPI out of its forks)
    proc = launch(ranks, "example.py", module=None, cwd=tmp_path, env=env, timeout=300,
                  cold=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Printed once (rank 0), with a trained accuracy well above chance (10 classes).
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("loss ")]
    assert len(lines) == 1, proc.stdout
    accuracy = float(lines[0].rsplit(" ", 1)[1])
    assert accuracy > 0.8, lines[0]
    assert (tmp_path / "trained.npz").stat().st_size > 0


def console_commands(block: str) -> list[tuple[str, list[str]]]:
    """The ``$`` commands of a ```console block (``\\`` continues a line), each with the output
    lines the page shows after it."""
    out: list[tuple[str, list[str]]] = []
    lines = block.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("$ "):
            command = lines[i][2:]
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
            out.append((command, []))
        elif out:
            out[-1][1].append(lines[i])
        i += 1
    return out


# A documented figure that is measured: a decimal, or a count of %, us, s or MB/s. Other numbers
# (ranks, rates, sizes, the token bucket) must be printed as the page shows them.
MEASURED = re.compile(r"[0-9]+\.[0-9]+|[0-9]+(?=%| us\b| s\b| MB/s)")


def shown(line: str) -> re.Pattern[str]:
    """A documented output line as a pattern: its measured figures stand for any number."""
    parts = MEASURED.split(line)
    return re.compile(r"[0-9.]+".join(re.escape(p) for p in parts))


def printed_as_shown(expected: list[str], output: list[str]) -> bool:
    """Every documented line printed, in order; ``...`` stands for any lines."""
    at = 0
    for line in expected:
        if line.strip() == "...":
            continue
        pattern = shown(line.split("    #")[0].rstrip())
        while at < len(output) and not pattern.fullmatch(output[at]):
            at += 1
        if at == len(output):
            return False
        at += 1
    return True


def test_the_shown_output_matcher_can_fail():
    doc = ["spdnn emulate: 2 nodes, burst 2 KiB", "...", "measured 12.3 MB/s (98% of the link)"]
    assert printed_as_shown(doc, ["spdnn emulate: 2 nodes, burst 2 KiB", "x",
                                  "measured 9.87 MB/s (91% of the link)"])
    assert not printed_as_shown(doc, ["spdnn emulate: 2 nodes, burst 32 KiB",
                                      "measured 9.87 MB/s (91% of the link)"])
    assert not printed_as_shown(doc, ["measured 9.87 MB/s (91% of the link)",
                                      "spdnn emulate: 2 nodes, burst 2 KiB"])


@pytest.mark.emulation
@pytest.mark.timeout(600)
@pytest.mark.long
def test_console_blocks_print_what_the_pages_show(tmp_path):
    """The pages' ```console blocks run, each command printing the lines shown after it
    (measured figures aside). Commands on a reader's own script (``my_*.py``) are not run."""
    from tests.helpers import emulation_refused

    env = user_env()
    commands = [c for b in blocks("console") for c in console_commands(b)]
    assert commands, "no console block found"
    if any(c.startswith("spdnn emulate") for c, _ in commands) and emulation_refused():
        pytest.skip(f"the console blocks run spdnn emulate: {emulation_refused()}")
    # The files the README's blocks leave behind that the console blocks use.
    for setup in ("spdnn generate random --sizes 64,256,256 --fan-in 16 --head 10 -o mlp.npz",
                  "spdnn-partition mlp.npz -P 2 -o plan2.npz --quiet"):
        subprocess.run(setup.split(), cwd=tmp_path, env=env, check=True, capture_output=True,
                       timeout=300)
    ran = 0
    for command, expected in commands:
        if re.search(r"\bmy_\w+\.py\b", command):
            continue
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=500)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        output = (proc.stderr + proc.stdout).splitlines()
        assert printed_as_shown(expected, output), \
            f"{command}\nshown:\n" + "\n".join(expected) + "\nprinted:\n" + "\n".join(output)
        ran += 1
    assert ran >= 1


# Names the code and the pages may give that are not modules: the digits' package data (data/
# installed as spdnn.data); bench_ab.py imports each old layout of the commits it compares.
NOT_MODULES = {"spdnn.data", "spdnn.replanners", "spdnn.partitioners"}  # data; entry-point groups
OLD_LAYOUTS = {"scripts/bench/bench_ab.py"}
FILE_SUFFIXES = {"py", "npz", "json", "md", "txt", "png"}  # spdnn.npz is a file
DOTTED = r"\b(?:spdnn|partition)(?:\.[A-Za-z_]\w*)+"


def _defines(tree: ast.Module | ast.ClassDef, name: str) -> ast.AST | None:
    """The top-level statement of ``tree`` that binds ``name`` (def, class, assignment,
    import), or None."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and node.name == name:
            return node
        targets = [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else \
            node.targets if isinstance(node, ast.Assign) else []
        for t in targets:
            if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(t)):
                return node
        if isinstance(node, (ast.Import, ast.ImportFrom)) \
                and any((a.asname or a.name.split(".")[0]) == name for a in node.names):
            return node
    return None


def _module_file(parts: list[str]) -> Path | None:
    path = ROOT.joinpath(*parts)
    for f in (path.with_suffix(".py"), path / "__init__.py"):
        if f.is_file():
            return f
    return None


def _exists(parts: list[str]) -> bool:
    """Whether ``a.b.c`` names a module, or a top-level name (or a class member) of one; a
    package's lazy exports (its ``_HOMES``: name -> module) are followed."""
    depth = max((i for i in range(1, len(parts) + 1) if _module_file(parts[:i])), default=0)
    if depth == 0:
        return False
    tree = ast.parse(_module_file(parts[:depth]).read_text())
    rest = parts[depth:]
    if not rest:
        return True
    if rest[0].startswith("__") and _defines(tree, "__getattr__") is not None:
        return True  # a module attribute made on first use (``spdnn.__version__``)
    homes = _defines(tree, "_HOMES")
    if isinstance(homes, ast.Assign) and rest[0] not in {
            getattr(n, "name", None) for n in tree.body}:
        home = ast.literal_eval(homes.value).get(rest[0])
        if home is not None:
            home = home if home.startswith(parts[0] + ".") else ".".join([*parts[:depth], home])
            return _exists([*home.split("."), *rest])
    scope: ast.AST | None = tree
    for attr in rest[:2]:  # a name, and a class's member
        if not isinstance(scope, (ast.Module, ast.ClassDef)):
            break
        scope = _defines(scope, attr)
        if scope is None:
            return False
    return True


def stale_names(text: str) -> set[str]:
    """The dotted ``spdnn.``/``partition.`` names in ``text`` that name no module, or no
    top-level name (or class member) of one: resolved from the source, nothing imported."""
    import re

    return {name for name in set(re.findall(DOTTED, text))
            if name not in NOT_MODULES and name.rpartition(".")[2] not in FILE_SUFFIXES
            and not _exists(name.split("."))}


def test_every_module_path_in_the_code_and_the_pages_exists():
    """A docstring or page that names ``spdnn.workload.locality`` after the module moved sends
    the reader nowhere (issue 49: three such names were left in docstrings)."""
    files = [p for d in ("spdnn", "partition", "scripts", "docs") for p in (ROOT / d).rglob("*")
             if p.suffix in (".py", ".md") and "_build" not in p.parts
             and str(p.relative_to(ROOT)) not in OLD_LAYOUTS] + [ROOT / "README.md"]
    stale = {f"{p.relative_to(ROOT)}: {n}" for p in files for n in stale_names(p.read_text())}
    assert sorted(stale) == []


def test_the_module_path_check_can_fail():
    assert stale_names("see spdnn.workload.locality and spdnn.cost.workload.nothing_here") \
        == {"spdnn.workload.locality", "spdnn.cost.workload.nothing_here"}
    assert stale_names("spdnn.cost.workload.locality, spdnn.kernels.encoding.MODES, "
                       "spdnn.data, spdnn.api.TrainResult.traffic, partition.cli") == set()


def test_the_option_tables_are_written_from_the_declarations():
    """docs/options.md and the option blocks of the other pages are what
    scripts/option_tables.py writes from spdnn.schema's declarations; a changed help text
    makes them stale."""
    import subprocess
    import sys

    script = ROOT / "scripts" / "option_tables.py"
    proc = subprocess.run([sys.executable, script, "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    from spdnn.model.options import TrainOptions
    from spdnn.schema import options, table

    page = (ROOT / "docs" / "options.md").read_text()
    assert table([options(TrainOptions)["epochs"]]).splitlines()[-1] in page
    assert "`--lr-schedule constant\\|step\\|cosine`" in page
