"""The layout the docs promise: no import circles, no two subpackages importing each other,
MPI only in spdnn/comm.py, partition never imported by spdnn, and long modules say why."""

from __future__ import annotations

import ast
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


def test_the_import_graph_has_no_circle_and_no_two_way_subpackages():
    if not IMPORTGRAPH.is_file():
        pytest.skip(f"{IMPORTGRAPH} not found (../shared absent)")
    proc = subprocess.run([sys.executable, str(IMPORTGRAPH)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "circles=0 two-way subpackage pairs=0" in proc.stdout


def test_mpi_is_imported_only_by_the_communication_module():
    users = sorted(path for path, tree in modules().items()
                   if any(n == "mpi4py" or n.startswith("mpi4py.") for n in imported(tree)
                          if not _type_only(tree, n)))
    assert users == ["spdnn/comm.py"], users


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


def test_modules_over_320_lines_say_why_they_are_one_concern():
    long = []
    for path, tree in modules().items():
        lines = len((ROOT / path).read_text().splitlines())
        doc = ast.get_docstring(tree) or ""
        if lines > 320 and "one concern" not in doc.lower():
            long.append(f"{path} ({lines} lines)")
    assert long == [], "split these or say in the docstring why each is one concern"


def test_the_wheel_lists_every_package():
    """pyproject.toml names its packages (the digits map data/ to spdnn.data): a subpackage
    left out would be missing from the wheel, as spdnn.jobs once was."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for pkg in PACKAGES
             for p in (ROOT / pkg).rglob("__init__.py")}
    assert found | {"spdnn.data"} == listed
