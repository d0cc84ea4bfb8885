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


def _results():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("results", BENCH / "results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _first_rows(tables):  # noqa: ANN001, ANN202
    return [{"what": r["case"], "spdnn": r["rate (edges/s)"], "peer": "-",
             "ratio": r["vs loop"]} for r in tables[0]]


def test_the_report_writes_its_record_with_every_table_and_the_json_file(tmp_path, capsys):
    harness = _harness()
    sys.path.insert(0, str(BENCH))  # publish imports the results module beside it
    out = tmp_path / "results.json"
    args = argparse.Namespace(no_write=False, json=str(out))
    record = harness.publish(args, "X", "Title", REPORT, area="Kernels", rows=_first_rows,
                             command="python scripts/bench/bench_x.py", results=tmp_path)
    assert "| a | 1.5e+10 | 1.00x |" in capsys.readouterr().out
    stored = json.loads((tmp_path / "X.json").read_text())
    assert stored == record and record["format"] == "spdnn-results/1"
    assert record["machine"] == harness.machine() and record["area"] == "Kernels"
    assert record["rows"][1] == {"what": "b", "spdnn": "7.2e+10", "peer": "-", "ratio": "4.80x"}
    assert record["tables"] == [
        [{"case": "a", "rate (edges/s)": "1.5e+10", "vs loop": "1.00x"},
         {"case": "b", "rate (edges/s)": "7.2e+10", "vs loop": "4.80x"}],
        [{"P": "2", "ms": "3.1"}]]
    assert json.loads(out.read_text())["sections"] == [record]
    assert not list(tmp_path.glob(".*tmp*"))


def test_no_write_and_a_comparison_of_trees_leave_the_records_alone(tmp_path):
    harness = _harness()
    sys.path.insert(0, str(BENCH))
    harness.publish(argparse.Namespace(no_write=True, json=None), "X", "T", REPORT,
                    area="Kernels", rows=_first_rows, results=tmp_path)
    harness.publish(argparse.Namespace(no_write=False, json=None), "Y", "T", REPORT,
                    area=None, rows=None, results=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_record_without_rows_or_with_an_unknown_area_is_refused():
    results = _results()
    good = {"format": results.FORMAT, "marker": "X", "page": "BENCHMARKS", "area": "Kernels",
            "title": "T", "command": "c", "machine": "m", "date": "2026-12-02",
            "rows": [{"what": "w", "spdnn": "1", "peer": "2", "ratio": "0.5x"}], "tables": []}
    assert results.check_record(dict(good), "x.json")["marker"] == "X"
    for change, says in (({"rows": []}, "no summary rows"), ({"area": "Cooking"}, "area"),
                         ({"date": "yesterday"}, "date"), ({"machine": ""}, "machine"),
                         ({"rows": [{"what": "w"}]}, "exactly")):
        try:
            results.check_record({**good, **change}, "x.json")
        except results.RecordError as e:
            assert str(e).startswith("x.json: ") and says in str(e)
        else:
            raise AssertionError(change)


def test_the_pages_are_their_records_rendered_within_the_limits():
    """docs/BENCHMARKS.md and docs/SCALING.md are what scripts/bench/results.py renders from
    docs/results/ (nobody edits them by hand), at most 500 lines, no cell over 400
    characters, every record naming its machine, date and command."""
    results = _results()
    records = results.load()
    assert len(records) >= 30
    for page in results.AREAS:
        text = results.page_path(page).read_text()
        assert text == results.render(page, records), "run python scripts/bench/results.py"
        assert results.problems(page, text) == []
        assert len(text.splitlines()) <= results.MAX_LINES
    assert results.problems("P", "| " + "x" * 401 + " |") == ["P line 1: a cell of 401 characters"]


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
