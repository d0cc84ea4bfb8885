"""docs/tutorial.md runs as written: its ```python and ```bash blocks in order, in one empty
directory, with the commands a user has after ``source .venv/bin/activate``; what it prints
says the model came across (its activations, an accuracy well above chance in torch after
spdnn's 4-rank fine-tuning)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.helpers import ROOT, import_torch
from tests.test_readme import user_env

import_torch()  # the tutorial starts and ends in PyTorch


def _blocks() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "tutorial.md").read_text()
    return re.findall(r"^```(python|bash)\n(.*?)^```", text, re.S | re.M)


def test_the_tutorial_runs_as_written(tmp_path):
    env = user_env()
    blocks = _blocks()
    assert [lang for lang, _ in blocks] == ["python", "bash", "bash", "python", "bash"]
    printed = []
    for i, (lang, code) in enumerate(blocks):
        if lang == "python":
            (tmp_path / f"step{i}.py").write_text(code)
            cmd = [sys.executable, f"step{i}.py"]
        else:
            cmd = ["bash", "-euo", "pipefail", "-c", code]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, f"{code}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        printed += proc.stdout.splitlines()
    assert "hidden activations: ('tanh', 'gelu')" in printed
    pruned = float(next(ln for ln in printed if ln.startswith("pruned in torch")).split()[-1])
    back = float(next(ln for ln in printed if ln.startswith("fine-tuned, back")).split()[-1])
    assert back > 0.85 and back > pruned + 0.3, (pruned, back)  # fine-tuning recovers
    metrics = json.loads((tmp_path / "tuned.json").read_text())
    assert metrics["epochs"][-1]["validation_accuracy"] > 0.85
    assert (tmp_path / "tuned.safetensors").stat().st_size > 0
