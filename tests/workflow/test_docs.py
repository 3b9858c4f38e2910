"""Documentation that must stay in line with the code."""

from __future__ import annotations

import os
import re

from conftest import ROOT
from feedbench.core import metric_table
from feedbench.core.knobs import markdown_table


def test_knob_table_in_docs_matches_knobs():
    text = open(os.path.join(ROOT, "docs", "knobs.md")).read()
    table = re.search(r"<!-- knobs:begin[^>]*-->\n(.*)<!-- knobs:end -->", text, re.S).group(1)
    assert table == markdown_table(), "regenerate with: python -m feedbench knobs --markdown"


def test_metric_table_in_docs_matches_the_metric_table():
    text = open(os.path.join(ROOT, "docs", "result-schema.md")).read()
    table = re.search(r"<!-- metrics:begin[^>]*-->\n(.*)<!-- metrics:end -->", text, re.S).group(1)
    assert table == metric_table.markdown_table(), (
        "regenerate with: python -m feedbench metrics --markdown"
    )


def test_each_layers_readme_names_every_module_of_the_layer():
    """workflow/feedbench/<layer>/README.md: one line per module, so a reader finds any module from
    the README's "Where things live"; a new module without its line fails here."""
    package = os.path.join(ROOT, "workflow", "feedbench")
    for layer in ("core", "plan", "harness", "analysis", os.path.join("analysis", "views")):
        folder = os.path.join(package, layer)
        readme_folder = (
            folder if layer != os.path.join("analysis", "views") else os.path.dirname(folder)
        )
        with open(os.path.join(readme_folder, "README.md"), encoding="utf-8") as f:
            readme = f.read()
        modules = sorted(
            n for n in os.listdir(folder) if n.endswith((".py", ".yaml")) and n != "__init__.py"
        )
        missing = [m for m in modules if f"`{m}`" not in readme]
        assert not missing, f"{readme_folder}/README.md does not name {missing}: one line each"
