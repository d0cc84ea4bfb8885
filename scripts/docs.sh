#!/usr/bin/env bash
# The documentation (docs/*.md and the API reference from the docstrings) as HTML in
# docs/_build, with Sphinx; any warning is an error. Installs sphinx and myst-parser (the
# "docs" extra) into ./.venv when missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/venv.sh
if ! python -c "import sphinx, myst_parser" 2>/dev/null; then
    python -m pip install --quiet --disable-pip-version-check -e ".[docs]"
fi
python -m sphinx -W --keep-going -q -b html docs docs/_build
echo "docs: docs/_build/index.html"
