"""scripts/bench/: the shared harness (command line, rounds, the report and its JSON records),
and every benchmark script answering --help on it (an import or path broken by a move fails
here, not in the next person's long run)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

from tests.helpers import ROOT, launch

BENCH = ROOT / "scripts" / "bench"
DOC = """What the benchmark measures.

    python scripts/bench/bench_x.py [--rounds 3]

More text."""
REPORT = """Command: `python scripts/bench/bench_x.py`.

| case | rate (edges/s) | vs loop |
| --- | --- | --- |
| a | 1.5e+10 | 1.00x |
| b | 7.2e+10 | 4.80x |

Second table:

| P | ms |
| --- | --- |
| 2 | 3.1 |"""


def _harness():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("bench_harness", BENCH / "harness.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_command_line_every_benchmark_has():
    ap = _harness().parser(DOC)
    args = ap.parse_args(["--no-write", "--json", "r.json"])
    assert args.no_write and args.json == "r.json"
    assert ap.description == "What the benchmark measures."
    assert "python scripts/bench/bench_x.py [--rounds 3]" in ap.format_help()


def test_rounds_keep_the_best_and_the_median():
    rounds = _harness().Rounds()
    for value in (3.0, 1.0, 2.0):
        rounds.add("spdnn", value)
    assert rounds.best() == {"spdnn": 3.0}
    assert rounds.best(higher_is_better=False) == {"spdnn": 1.0}
    assert rounds.median() == {"spdnn": 2.0}


def test_the_report_writes_its_section_and_the_same_tables_as_json(tmp_path, capsys):
    harness = _harness()
    page = tmp_path / "BENCHMARKS.md"
    page.write_text("# Benchmarks\n\n<!-- X -->\nold\n<!-- /X -->\n\nkept\n")
    out = tmp_path / "results.json"
    args = argparse.Namespace(no_write=False, json=str(out))
    harness.publish(args, "X", "Title", REPORT, page)
    harness.publish(args, "Y", "Another", "| k |\n| --- |\n| v |", page)
    text = page.read_text()
    assert "old" not in text and "| b | 7.2e+10 | 4.80x |" in text and "kept" in text
    assert text.count("Machine: ") == 2 and "## Another" in text
    assert "| a | 1.5e+10 | 1.00x |" in capsys.readouterr().out
    record = json.loads(out.read_text())
    assert record["format"] == "spdnn-bench/1" and record["machine"] == harness.machine()
    first, second = record["sections"]
    assert first["marker"] == "X" and second["tables"] == [[{"k": "v"}]]
    assert first["tables"] == [
        [{"case": "a", "rate (edges/s)": "1.5e+10", "vs loop": "1.00x"},
         {"case": "b", "rate (edges/s)": "7.2e+10", "vs loop": "4.80x"}],
        [{"P": "2", "ms": "3.1"}]]
    assert [p.name for p in tmp_path.iterdir()] != [] and not list(tmp_path.glob(".*tmp*"))


def test_no_write_leaves_the_page_alone(tmp_path):
    page = tmp_path / "BENCHMARKS.md"
    page.write_text("# Benchmarks\n")
    _harness().publish(argparse.Namespace(no_write=True, json=None), "X", "T", REPORT, page)
    assert page.read_text() == "# Benchmarks\n"


def test_every_benchmark_script_answers_help():
    """One process runs each script's --help (as ``python scripts/bench/NAME.py --help``
    would: its directory first on the path). Modules without a command (the harness, the
    report and PyTorch step builders) are imported by the others; a script that needs torch,
    which is not a dependency, may say so."""
    names = sorted(p.name for p in BENCH.glob("*.py")
                   if 'if __name__ == "__main__":' in p.read_text())
    assert len(names) >= 25, names
    probe = (
        "import runpy, sys\n"
        f"sys.path.insert(0, {str(BENCH)!r})\n"
        "failed = []\n"
        f"for name in {names!r}:\n"
        f"    sys.argv = [name, '--help']\n"
        "    try:\n"
        f"        runpy.run_path({str(BENCH)!r} + '/' + name, run_name='__main__')\n"
        "        failed.append(name + ': no exit')\n"
        "    except SystemExit as e:\n"
        "        if e.code not in (0, None):\n"
        "            failed.append(f'{name}: exit {e.code}')\n"
        "    except ModuleNotFoundError as e:\n"
        "        if e.name != 'torch':\n"
        "            failed.append(f'{name}: {e}')\n"
        "    except Exception as e:\n"
        "        failed.append(f'{name}: {type(e).__name__}: {e}')\n"
        "print('FAILED', failed)\n")
    proc = launch(0, "-c", probe, module=None, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "FAILED []" in proc.stdout, proc.stdout[-3000:]
    assert sys.executable  # the probe ran with this interpreter (launch uses it)
