"""feedbench.slurm without a cluster: the plugin workarounds and the record of a lost cell.

See docs/reliability-slurm.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex

import pytest
from feedbench import slurm

plugin = pytest.importorskip("snakemake_executor_plugin_slurm")


def test_a_cancelled_job_reads_as_cancelled_through_the_plugins_own_status_query():
    # The plugin's query runs this command as it would run sacct; its output is sacct's for a scancel'ed job.
    command = "printf " + shlex.quote("5|CANCELLED by 0\n6|COMPLETED\n")
    states, _ = asyncio.run(plugin.query_job_status(command, logging.getLogger("test")))
    assert states["5"] == "CANCELLED by 0"  # what the plugin compares with "CANCELLED": no match, waits forever
    slurm.patch_plugin()
    slurm.patch_plugin()  # twice is once
    states, _ = asyncio.run(plugin.query_job_status(command, logging.getLogger("test")))
    assert states == {"5": "CANCELLED", "6": "COMPLETED"}
    assert plugin.get_account(logging.getLogger("test")) is None  # no "sacct: invalid option -- '1'"


def test_the_run_id_comes_from_snakemakes_logs(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("Building DAG of jobs...\nSLURM run ID: 1234-abcd\n")
    assert slurm.run_id(str(log)) == slurm.run_id([str(log)]) == "1234-abcd"
    assert slurm.run_id(None) is None and slurm.run_id([str(tmp_path / "missing")]) is None
    assert slurm.job_states("") == {}


def test_the_first_cell_wider_than_a_node_is_named():
    cells = [("a", "narrow", {"num_workers": 1}), ("b", "wide", {"num_workers": 4})]
    assert slurm.cells_fit_error(cells, "debug", 4) == (
        "bad config: experiments.b: cell wide asks for 5 CPUs per node (1 rank(s) x (num_workers 4 + 1)); "
        "allowed: at most 4, the CPUs of a node in Slurm partition 'debug' (sinfo)"
    )
    assert slurm.cells_fit_error(cells[:1], "debug", 4) is None


def test_a_lost_cell_keeps_the_harness_result_and_says_its_slurm_state(tmp_path):
    labelled = {"experiment": "e", "cell": "c", "repeat": 1}
    empty = slurm.lost_result(str(tmp_path / "result.json"), labelled, None)
    assert empty["status"] == "failed" and empty["error"]["type"] == "SlurmJobLost"
    assert empty["error"]["message"].startswith("no Slurm job ran")

    harness = {"status": "failed", "metrics": {"steps": 7}, "error": {"type": "Terminated", "message": "SIGTERM"}}
    (tmp_path / "result.json").write_text(json.dumps(harness))
    kept = slurm.lost_result(str(tmp_path / "result.json"), labelled, ("12", "CANCELLED"))
    assert kept["metrics"]["steps"] == 7 and kept["error"]["type"] == "Terminated"
    assert kept["error"]["message"] == (
        "Slurm job 12 ended CANCELLED; the cell is lost and the next run runs it again; the harness said: SIGTERM"
    )
