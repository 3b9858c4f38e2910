"""harness.runner, as the bench job's command line reaches it (feedbench.__main__.run_or_launch),
in this process: what the process boundary does not change."""

from __future__ import annotations

import json

import feedbench.core.cell
import feedbench.harness.runner
from feedbench.__main__ import run_or_launch
from helpers.cells import TINY_LOADER


def test_a_bench_jobs_cell_is_parsed_once(tmp_path, monkeypatch):
    """The command line parses and fits the cell to pick its launch, and hands it to the runner,
    which does not parse it again (issue #52)."""
    parsed = []
    real = feedbench.core.cell.parse_cell

    def counted(raw):
        parsed.append(raw)
        return real(raw)

    monkeypatch.setattr(feedbench.core.cell, "parse_cell", counted)
    monkeypatch.setattr(feedbench.harness.runner, "parse_cell", counted)
    knobs = dict(TINY_LOADER, torch_threads=1, experiment="e", cell="c", repeat=1)
    assert run_or_launch(knobs, str(tmp_path)) == 0
    assert len(parsed) == 1
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "ok" and result["metrics"]["steps"] == 2
