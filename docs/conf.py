"""Sphinx configuration: the Markdown pages (MyST) and the API reference from the docstrings.
Built by scripts/docs.sh with warnings as errors."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

project = "spdnn"
author = "the spdnn developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False}
html_theme = "alabaster"
# The measured-figure pages are long tables written by scripts; their headings skip levels.
suppress_warnings = ["myst.header"]
