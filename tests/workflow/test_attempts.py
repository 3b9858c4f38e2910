"""Every attempt at a cell kept (issue #36; docs/reliability-slurm.md, "Every attempt kept"): a
rerun moves the earlier attempt (its result or lost record, steps, log) to the cell's attempts/<n>/
before it writes; the summary reads the current attempt only, the report names the earlier ones. On
Slurm: tests/workflow/test_slurm_faults.py (a scancel'ed cell)."""

from __future__ import annotations

import csv
import json

import pytest
from conftest import write_user_module
from feedbench.core import attempts
from feedbench.plan import slurm
from helpers.cells import LABELLED
from helpers.snakemake_run import snakemake, workflow_copy

# A user's dataset that fails its cell at sample 20 (the fifth batch of 4: a warm-up step and four
# measured) while the file fail-once is in the working directory, the harness's.
USER_CODE = """
import os

import torch
from torch.utils.data import Dataset


class Flaky(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        if index == 20 and os.path.exists("fail-once"):
            raise OSError("the volume went away at sample 20")
        return torch.full((4,), float(index))


def build(ctx):
    return Flaky()
"""
CONFIG = {
    "python_path": ["src"],
    "defaults": {"repeats": 1, "device": "cpu", "torch_threads": 1},
    "experiments": {
        "flaky": {
            "base": {
                "scenario": "loader",
                "dataset": "flaky:build",
                "batch_size": 4,
                "shuffle": False,
                "steps": 8,
                "warmup_steps": 1,
            },
        },
    },
}
CELL = "results/cells/flaky/base/rep1"


def steps_rows(path) -> int:
    with open(path) as f:
        return sum(1 for _ in csv.DictReader(f))


@pytest.mark.slow
def test_a_failed_cell_run_again_keeps_its_first_attempt_and_the_report_counts_it(tmp_path):
    workflow, workdir = workflow_copy(tmp_path)
    write_user_module(workdir, "flaky", USER_CODE)
    (workdir / "fail-once").write_text("")
    first = snakemake(workflow, workdir, CONFIG)
    # the failed cell fails the run (README, "Exit code")
    assert first.returncode == 1, first.stderr[-4000:]
    failed_steps = steps_rows(workdir / CELL / "steps.csv")
    assert failed_steps > 0, "the failed attempt measured steps before sample 20"

    (workdir / "fail-once").unlink()
    # retry_failed (the default) runs the failed cell again
    again = snakemake(workflow, workdir, CONFIG)
    assert again.returncode == 0, again.stderr[-4000:]
    kept = workdir / CELL / "attempts" / "1"
    assert json.loads((kept / "result.json").read_text())["status"] == "failed"
    assert steps_rows(kept / "steps.csv") == failed_steps, (
        "the first attempt's steps, as it measured them"
    )
    assert "the volume went away at sample 20" in (kept / attempts.LOG).read_text(), (
        "its bench log, not the rerun's"
    )
    facts = json.loads((kept / attempts.RECORD).read_text())
    assert (facts["attempt"], facts["status"], facts["steps"]) == (1, "failed", failed_steps), facts
    rerun = json.loads((workdir / CELL / "result.json").read_text())
    assert rerun["status"] == "ok" and rerun["cell"]["attempt"].startswith("retry-after-"), (
        "the attempt it planned"
    )
    assert "sample 20" not in (workdir / "logs/bench/flaky/base/rep1.log").read_text()

    rows = list(csv.DictReader(open(workdir / "results" / "summary.csv")))
    assert [(row["cell"], row["status"]) for row in rows] == [("base", "ok")], (
        "the summary reads the current attempt"
    )
    report = (workdir / "results" / "report" / "index.html").read_text()
    assert f"attempt 2; attempt 1 failed (OSError) after {failed_steps} steps" in report, report[
        -3000:
    ]


def test_a_folder_without_an_attempt_moves_nothing_and_attempts_are_numbered_on(tmp_path):
    folder = tmp_path / "rep1"
    folder.mkdir()
    (folder / "cell.yaml").write_text("{}")
    assert attempts.keep_earlier(str(folder)) is None and (folder / "cell.yaml").exists()
    assert attempts.earlier_text(str(folder)) is None
    for n, state in ((1, "NODE_FAIL"), (2, "CANCELLED")):
        lost = slurm.lost_result(str(folder / "result.json"), LABELLED, (str(10 + n), state), None)
        (folder / "lost.json").write_text(json.dumps(lost))
        (folder / "steps.csv").write_text(
            "step,total_ms\n" + "".join(f"{i},1.0\n" for i in range(50 + n))
        )
        assert attempts.keep_earlier(str(folder)) == str(folder / "attempts" / str(n))
        assert sorted(p.name for p in folder.iterdir()) == ["attempts"]
    # cut mid-write
    (folder / "result.json").write_text('{"schema_version": 1, "status": "ok", "metr')
    assert attempts.keep_earlier(str(folder)) == str(folder / "attempts" / "3")
    assert attempts.earlier_text(str(folder)) == (
        "attempt 4; attempt 1 lost to NODE_FAIL after 51 steps; attempt 2 lost to CANCELLED "
        "after 52 steps; attempt 3 left a damaged result after 0 steps"
    )
    record = json.loads((folder / "attempts" / "1" / attempts.RECORD).read_text())
    assert (record["slurm_job_id"], record["slurm_state"]) == ("11", "NODE_FAIL")
