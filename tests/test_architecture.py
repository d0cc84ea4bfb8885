"""The layout the docs promise: no import circles, no two subpackages importing each other,
MPI only in spdnn/comm/mpi.py, partition never imported by spdnn, and long modules say why."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

IMPORTGRAPH = ROOT.parent / "shared" / "tools" / "importgraph.py"
PACKAGES = ("spdnn", "partition")


def modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text(), str(p))
            for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imported(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def import_edges() -> dict[str, set[str]]:
    """Module -> the modules of this checkout it imports (inside functions too; relative
    imports resolved; importing a package's ``__init__`` draws no edge), as
    ../shared/tools/importgraph.py counts them."""
    files = {p: ".".join(p.relative_to(ROOT).with_suffix("").parts)
             for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    mods = {m.removesuffix(".__init__"): p for p, m in files.items()}

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for p, m in files.items():
        pkg = m.removesuffix(".__init__") if m.endswith("__init__") else m.rpartition(".")[0]
        src = m.removesuffix(".__init__")
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                r = resolve(t)
                if r and r != src and mods[r].name != "__init__.py":
                    edges[src].add(r)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _subpackage(m: str) -> str:
    parts = m.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else parts[0]


def test_the_import_graph_has_no_circle_and_no_two_way_subpackages():
    edges = import_edges()
    assert circles(edges) == []
    pairs = {(_subpackage(a), _subpackage(b)) for a, bs in edges.items() for b in bs}
    pairs = {(a, b) for a, b in pairs if a != b and "." in a and "." in b}
    assert sorted(p for p in pairs if (p[1], p[0]) in pairs) == []
    # The counting agrees with the shared tool, where it is beside the checkout.
    if IMPORTGRAPH.is_file():
        proc = subprocess.run([sys.executable, str(IMPORTGRAPH)], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_import_check_finds_a_circle():
    """The check can fail: a circle and a two-way pair planted in the graph are found."""
    edges = import_edges()
    edges["spdnn.io.bundle"] = edges["spdnn.io.bundle"] | {"spdnn.runtime.session"}
    assert any("spdnn.io.bundle" in c and "spdnn.runtime.session" in c
               for c in circles(edges))


def test_mpi_is_imported_only_by_the_communication_module():
    users = sorted(path for path, tree in modules().items()
                   if any(n == "mpi4py" or n.startswith("mpi4py.") for n in imported(tree)
                          if not _type_only(tree, n)))
    assert users == ["spdnn/comm/mpi.py"], users


def test_the_communication_package_starts_mpi_only_when_its_mpi_module_loads():
    """spdnn.comm's modules other than mpi and collective (processes, threads, limits, the
    watchdog) are read by the partitioner and the commands before any MPI job exists:
    importing them loads no MPI, and ``spdnn.comm.Communicator`` loads it on first use."""
    script = ("import sys\n"
              "import spdnn.comm, spdnn.comm.processes, spdnn.comm.threads, "
              "spdnn.comm.memlimit, spdnn.comm.watchdog, spdnn.comm.interrupt, "
              "spdnn.comm.object_buffers\n"
              "print('mpi4py.MPI' in sys.modules)\n"
              "spdnn.comm.Communicator\n"
              "print('mpi4py.MPI' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, text=True,
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


def _type_only(tree: ast.Module, name: str) -> bool:
    """An import under ``if TYPE_CHECKING:`` (annotations only) does not load MPI."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            inner = ast.Module(body=node.body, type_ignores=[])
            if name in imported(inner):
                return True
    return False


def test_spdnn_never_imports_the_partitioner():
    bad = [path for path, tree in modules().items() if path.startswith("spdnn/")
           and any(n == "partition" or n.startswith("partition.") for n in imported(tree))]
    assert bad == []


def test_the_wheel_lists_every_package():
    """pyproject.toml names its packages (the digits map data/ to spdnn.data): a subpackage
    left out would be missing from the wheel, as spdnn.jobs once was."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for pkg in PACKAGES
             for p in (ROOT / pkg).rglob("__init__.py")}
    assert found | {"spdnn.data"} == listed


def test_importing_the_library_changes_no_thread_setting_and_loads_no_numpy():
    """``import spdnn`` and ``import partition`` leave BLAS/OpenMP/numba alone (the commands pin
    one thread per rank: spdnn.cli.thread_pools), load neither numpy nor MPI, and give the installed
    version."""
    script = ("import os, sys, spdnn, partition\n"
              "from importlib.metadata import version\n"
              "assert spdnn.__version__ == version('spdnn'), spdnn.__version__\n"
              "print(sorted(v for v in os.environ if v.endswith('_NUM_THREADS')))\n"
              "print(sorted(m for m in ('numpy', 'numba', 'mpi4py') if m in sys.modules))\n")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, text=True,
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "[]"]


def test_every_measuring_script_pins_one_thread_before_numpy_loads():
    """Importing the library pins nothing, so a benchmark that forgot to would time BLAS and
    numba pools of every core in each rank (2 ranks on 2 cores: a step many times slower, seen in
    scripts/bench/validate_model.py); the PyTorch and GraphBLAS baselines set their own threads."""
    own = {"torch_baselines.py", "torch_ddp.py", "torch_xc.py", "challenge_engines.py",
           "bound_groups.py", "memcap.py", "harness.py", "results.py",
           "mutants.py", "option_tables.py"}  # these run tests or write docs: they measure
    # nothing
    missing = []
    for path in sorted((ROOT / "scripts").glob("**/*.py")):
        if path.name in own:
            continue
        body = ast.parse(path.read_text()).body
        names = [a.name for node in body if isinstance(node, ast.Import) for a in node.names]
        firsts = [n for n in names if n in ("spdnn.cli.thread_pools", "numpy")]
        if not firsts or firsts[0] != "spdnn.cli.thread_pools":
            missing.append(path.name)
    assert missing == [], missing


def test_the_optimizers_defaults_are_written_once():
    """An optimizer's settings live in its config (spdnn.optim) alone: TrainOptions and the
    command line have one field and one flag for each, left None, so a job takes the chosen
    optimizer's default."""
    import spdnn
    from spdnn.cli.parser import build_parser
    from spdnn.model.options import optimizer_config
    from spdnn.optim import OPTIMIZERS, setting_options

    defaults = spdnn.TrainOptions()
    args = build_parser().parse_args(["train", "--network", "n.npz"])
    names = set(setting_options())
    assert names == {f for cls in OPTIMIZERS.values() for f in cls.Config.__dataclass_fields__}
    for name in names:
        assert getattr(defaults, name) is None and getattr(args, name) is None, name
    for name, cls in OPTIMIZERS.items():
        options = spdnn.TrainOptions(optimizer=name)
        assert optimizer_config(options) == cls.Config()


def test_every_option_is_declared_once_and_reaches_every_surface():
    """Each option of TrainOptions and RunOptions is declared (spdnn.schema): the command
    line's flag has its default and its check (a bad value refused by the flag, before the
    job), and each one a checkpoint records is a manifest field."""
    import argparse

    from spdnn.cli.parser import build_parser
    from spdnn.io.jsonfiles import manifest_file, recorded_options
    from spdnn.model.options import RunOptions, TrainOptions
    from spdnn.schema import options

    parser = build_parser()
    train = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
                 ).choices["train"]
    by_dest = {a.dest: a for a in train._actions}
    for cls in (RunOptions, TrainOptions):
        for name, o in options(cls).items():
            if o.cli is None or name in ("plan", "replicas", "stream_layers"):  # infer's
                continue
            action = by_dest[name]
            assert o.cli in action.option_strings, name
            if action.type is not None:
                assert action.default == o.default, name
    fields = set(manifest_file().__struct_fields__)
    assert set(recorded_options()) <= fields
    assert {"lr", "betas", "batch_size", "dtype", "dropout"} <= set(recorded_options())


def test_public_functions_take_at_most_two_arguments_by_position():
    """Beyond the first argument or two, every public function of spdnn and partition is
    keyword-only."""
    import inspect

    import partition
    import spdnn

    for module in (spdnn, partition):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj):
                positional = [p.name for p in inspect.signature(obj).parameters.values()
                              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
                assert len(positional) <= 2, f"{module.__name__}.{name}{positional}"



def test_no_module_but_the_chooser_compares_a_backends_name():
    """The kernel backend is an object chosen once (spdnn.backends): every other
    module of the library, the partitioner and the scripts asks it for an operation
    (``active().op``) or a compiled half (``active().compiled``), never for its name."""
    import re

    name = r"""["'](numba|scipy)["']"""
    compare = re.compile(rf"backend\(\)\s*[!=]=|[!=]=\s*{name}|{name}\s*[!=]=")
    found = []
    for pkg in (*PACKAGES, "scripts"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path.name == "backends.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if compare.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == [], found


def test_no_module_compares_an_output_activations_name():
    """The output layer's activation is an object (``Network.output_function``, from
    spdnn.model.activations.OUTPUTS) that owns its value, slope and torch module: no module
    branches on the name a network records for it."""
    import re

    compare = re.compile(r"""output_activation\s*[!=]=|[!=]=\s*["']linear["']|"""
                         r"""["']linear["']\s*[!=]=""")
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if compare.search(line)]
    assert found == [], found


def test_the_scipy_backend_imports_no_numba_in_training_and_inference(tmp_path):
    """Under SPDNN_KERNELS=scipy, training (every optimizer path, dropout, SET and RigL, LSH's
    sampled output and hidden layers) and inference run without loading numba: the scipy
    backend stands alone (the oracle, and a platform without numba)."""
    script = (
        "import sys, numpy as np, spdnn\n"
        "net = spdnn.random_network([64, 48, 10], fan_in=8, seed=0)\n"
        "for o in (dict(optimizer='adam'), dict(sparse_update='rigl', update_every=5),\n"
        "          dict(sparse_update='set', update_every=5, dropout=0.2),\n"
        "          dict(lsh='2:3:4', lsh_random=2), dict(lsh='1:4:6')):\n"
        "    spdnn.train(net, options=spdnn.TrainOptions(epochs=1, **o), verbose=False)\n"
        "spdnn.predict(net, np.zeros((3, 64)))\n"
        "spdnn.infer(net, verbose=False)\n"
        "assert spdnn.kernels.backend() == 'scipy'\n"
        "print('numba' in sys.modules)\n")
    env = {**os.environ, "SPDNN_KERNELS": "scipy"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
