"""spdnn plot and spdnn-partition stats --plot: real images from a real run, clear errors."""

import json
import sys

import pytest

from spdnn.errors import SpdnnError
from tests.helpers import assert_one_line_error, run_spdnn

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pytest.importorskip("matplotlib", reason="matplotlib (the plot extra) is not installed")
    d = tmp_path_factory.mktemp("plots")
    assert run_spdnn("generate", "local", "--hidden", "8x8", "--head", "10",
                     "-o", d / "net.npz").returncode == 0
    proc = run_spdnn("train", "--network", d / "net.npz", "--data", "digits", "--epochs", "3",
                     "--metrics-out", d / "train.json")
    assert proc.returncode == 0, proc.stderr
    proc = run_spdnn(d / "net.npz", "-P", "3", "-o", d / "plan.npz", "--quiet",
                     module="partition")
    assert proc.returncode == 0, proc.stderr
    return d


def test_training_plot(run):
    proc = run_spdnn("plot", run / "train.json", "-o", run / "train.png")
    assert proc.returncode == 0, proc.stderr
    data = (run / "train.png").read_bytes()
    assert data.startswith(PNG) and len(data) > 20_000  # three panels, not an empty canvas
    proc = run_spdnn("plot", run / "train.json", "-o", run / "train.svg")
    assert proc.returncode == 0 and b"training loss" in (run / "train.svg").read_bytes()


def test_plan_plot(run):
    proc = run_spdnn("stats", run / "net.npz", run / "plan.npz", "--plot", run / "plan.svg",
                     module="partition")
    assert proc.returncode == 0, proc.stderr
    svg = (run / "plan.svg").read_bytes()
    for text in (b"forward (expand) rows per layer", b"block", b"cyclic", b"rows per rank"):
        assert text in svg


def test_bad_inputs_are_one_line_errors(run):
    (run / "empty.json").write_text(json.dumps({"epochs": []}))
    (run / "junk.json").write_text("{not json")
    for path, words in ((run / "empty.json", ["empty.json", "'epochs'", "length >= 1"]),
                        (run / "junk.json", ["junk.json", "not valid JSON"]),
                        (run / "none.json", ["none.json", "no such file"])):
        assert_one_line_error(run_spdnn("plot", path, "-o", run / "x.png"), *words)
    assert_one_line_error(run_spdnn("plot", run / "train.json", "-o", run / "x.gif"),
                          "x.gif", ".png, .pdf or .svg")
    assert not (run / "x.png").exists()


def test_without_matplotlib_the_message_says_how_to_get_it(monkeypatch, tmp_path):
    from spdnn.io import plots

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if absent
    (tmp_path / "m.json").write_text(json.dumps(
        {"epochs": [{"epoch": 1, "loss": 1.0, "samples_per_second": 10.0}]}))
    with pytest.raises(SpdnnError, match="pip install matplotlib"):
        plots.plot_training(tmp_path / "m.json", tmp_path / "m.png")
