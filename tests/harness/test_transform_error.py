"""A user transform that raises inside a loader worker fails its cell with the transform's name and
the exception's first line, in the result and in the report, not with PyTorch's "Caught ValueError
in DataLoader worker process 0." and a traceback as text."""

from __future__ import annotations

import json
import re

import pytest
from feedbench.analysis.aggregate import load_results, write_summary
from feedbench.analysis.report import write_report
from feedbench.harness.runner import run, worker_message

# USER_CODE, imported by its path (the user_module fixture, tests/conftest.py)
USER_MODULE = "exploding"
USER_CODE = """
import torch
from torch.utils.data import Dataset
from torchvision import transforms


class Crop:
    def __call__(self, x):
        return x[:2]


class Explode:
    def __call__(self, x):
        if int(x[0]) == 5:
            raise ValueError("sample 5 has no pixels left\\nand a second line nobody needs")
        return x


class Sample(Dataset):
    def __init__(self, n):
        self.n, self.transform = n, transforms.Compose([Crop(), Explode()])

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return self.transform(torch.full((4,), float(index)))


def build(ctx, n=64):
    return Sample(n)
"""
MESSAGE = "transform 'Explode' failed: sample 5 has no pixels left"


def run_cell(user_module: str, out: str, workers: int, stage_timing: bool) -> dict:
    knobs = {
        "experiment": "own",
        "cell": f"num_workers-{workers}",
        "repeat": 1,
        "baseline": True,
        "dataset": "exploding:build",
        "python_path": [user_module],
        "scenario": "loader",
        "device": "cpu",
        "batch_size": 4,
        "shuffle": False,
        "num_workers": workers,
        "steps": 8,
        "warmup_steps": 1,
        "torch_threads": 1,
        "monitor_interval_s": 5,
        "stage_timing": stage_timing,
    }
    assert run(knobs, out) == 1
    with open(f"{out}/result.json") as f:
        return json.load(f)


@pytest.mark.parametrize("stage_timing", [False, True], ids=["untimed", "timed"])
def test_a_transform_that_raises_in_a_worker_names_itself_in_the_result_and_the_report(
    user_module, tmp_path, stage_timing
):
    result = run_cell(user_module, str(tmp_path / "cells" / "own" / "w2" / "rep1"), 2, stage_timing)
    assert result["status"] == "failed"
    error = result["error"]
    assert error["type"] == "ValueError"
    assert re.fullmatch(
        re.escape(MESSAGE) + r" \(in DataLoader worker process [01]\)", error["message"]
    ), error
    assert "Explode" in error["traceback"]
    # The report's list of failed cells leads with that line, not with the traceback PyTorch wraps
    # it in.
    summary = str(tmp_path / "summary.csv")
    write_summary(
        load_results([str(tmp_path / "cells" / "own" / "w2" / "rep1" / "result.json")]), summary
    )
    html = str(tmp_path / "report.html")
    config = {"experiments": {"own": {"title": "A transform that raises"}}}
    write_report(
        summary,
        [],
        [str(tmp_path / "cells" / "own" / "w2" / "rep1" / "result.json")],
        config,
        "0",
        html,
    )
    with open(html) as f:
        page = f.read()
    failed = page[page.index('id="failed"') : page.index('id="provenance"')].replace("&#39;", "'")
    assert f"<p>{MESSAGE} (in DataLoader worker process" in failed and ": ValueError</h3>" in failed


def test_in_the_main_process_the_message_is_the_same_without_the_worker(user_module, tmp_path):
    error = run_cell(user_module, str(tmp_path / "w0"), 0, False)["error"]
    assert (error["type"], error["message"]) == ("ValueError", MESSAGE)


def test_a_worker_error_from_outside_a_transform_keeps_its_own_last_line():
    text = (
        "Caught KeyError in DataLoader worker process 3.\nOriginal Traceback (most recent call "
        "last):\n  File \"x.py\", line 1, in <module>\n    f()\nKeyError: 'label'\n"
    )
    assert worker_message(text) == "'label' (in DataLoader worker process 3)"
    assert worker_message("a plain error\nwith lines") is None
