"""What a real cluster does to a run, on the localhost Slurm cluster (issues #9 and #26;
docs/reliability-slurm.md).

The cluster keeps Slurm's default accounting flags, as sites ship it: sacct returns no job comments.

* a cell wider than a node, or a target's partition the cluster lacks, is refused before any job,
  with one line;
* the `gres` way of asking for GPUs (with gpu: 0) reaches sbatch alone and runs;
* a job cancelled with scancel and a job on a node that fails (NODE_FAIL): the
  run ends with exit 1, the report is still made and lists both cells with
  their Slurm state, each lost cell has a lost.json the result schema accepts,
  the cancelled cell keeps the steps it measured, and the next run runs exactly
  those two cells again, keeping each lost attempt in the cell's attempts/1/;
* no process of the cancelled job is left once Slurm's KillWait has passed;
* a SIGTERM to a run whose job is pending cancels it, records the cell lost and writes the report;
* a job pending on a down node says why within a minute, and with slurm.pending_timeout it is
  cancelled, its cell recorded lost "pending: node down ...", and the run ends with its report and
  exit 1.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from feedbench.core.result import invalid
from helpers.slurm_cluster import submitted_bench_jobs
from helpers.snakemake_run import copy_workflow, snakemake_env

# the session fixture slurm_cluster: one cluster per session
pytest_plugins = ["helpers.slurm_cluster"]

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CELL = {
    "scenario": "train",
    "dataset": "memory",
    "model": "sleep",
    "input_size": 16,
    "batch_size": 8,
    "num_samples": 64,
}


def snakemake(slurm_cluster, workdir, config: dict, *args: str, wait: bool = True):
    """The workflow copied into workdir, run through profiles/slurm with only the SITE settings
    given."""
    workflow = str(workdir / "workflow")
    if not os.path.exists(workflow):
        os.makedirs(workflow)
        copy_workflow(workflow)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = snakemake_env(slurm_cluster.env)
    command = [
        sys.executable, "-m", "snakemake", "-s", os.path.join(workflow, "Snakefile"),
        "--directory", str(workdir / "run"),
        "--configfile", str(workdir / "config.yaml"), "--profile", os.path.join(workflow, "profiles", "slurm"),  # noqa: E501
        "--default-resources", f"slurm_partition={slurm_cluster.partition}", f"slurm_account={slurm_cluster.account}",  # noqa: E501
        "runtime=10", "mem_mb=500",
        "--slurm-init-seconds-before-status-checks", "2",
        "--set-resources", "bench:mem_mb=1000", *args,
    ]  # fmt: skip
    if wait:
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    log = open(workdir / "snakemake.log", "w")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)


def assert_refused_before_any_job(proc, workdir, line: str) -> None:
    """The run stopped with exit 1 and `line` before it submitted a job or measured a cell."""
    assert proc.returncode == 1
    assert line in proc.stderr, proc.stderr[-3000:]
    assert (
        "Submitted job" not in proc.stderr and not (workdir / "run" / "results" / "cells").exists()
    )


def bench_jobs(slurm_cluster, output: str) -> dict[str, dict[str, str]]:
    """The run's bench jobs by experiment_cell_repeat: their ids from the run's output, their rows
    from accounting."""
    submitted = submitted_bench_jobs(output)
    rows = slurm_cluster.jobs(submitted.values(), "State,AllocTRES") if submitted else {}
    return {cell: rows[job] for cell, job in submitted.items()}


def summary(workdir) -> dict[str, dict[str, str]]:
    return {
        row["cell"]: row
        for row in csv.DictReader(open(workdir / "run" / "results" / "summary.csv"))
    }


def test_a_cell_wider_than_a_node_is_refused_before_any_job(slurm_cluster, tmp_path):
    config = {
        "defaults": {"repeats": 1, "steps": 2, "device": "cpu"},
        "experiments": {"wide": {"base": dict(CELL, num_workers=4)}},
    }
    line = (
        "bad config: experiments.wide: cell base asks for 5 CPUs per node (1 rank(s) x "
        "(num_workers 4 + 1)); allowed: at most 4, the CPUs of a node in Slurm partition 'debug' "
        "(sinfo)"
    )
    assert_refused_before_any_job(snakemake(slurm_cluster, tmp_path, config), tmp_path, line)


def test_a_target_partition_the_cluster_lacks_is_refused_before_any_job(slurm_cluster, tmp_path):
    """The target's compute cells (rule bench_target) are checked against their own partition, as
    bench's are."""
    config = {
        "defaults": {"repeats": 1, "steps": 2, "device": "cpu"},
        "target": {
            "gpu": "H100",
            "cores_per_gpu": 2,
            "cpu_speed": 1.0,
            "compute": "measured",
            "partition": "nosuch",
        },
        "experiments": {"w": {"base": dict(CELL, model="mlp", num_workers=0)}},
    }
    line = (
        "bad config: slurm_partition of rule bench_target (target.partition, or set-resources "
        "bench_target:slurm_partition): 'nosuch' is not a partition; allowed: "
    )
    assert_refused_before_any_job(snakemake(slurm_cluster, tmp_path, config), tmp_path, line)


def test_gpus_asked_for_with_gres_instead_of_gpu(slurm_cluster, tmp_path):
    config = {
        "defaults": {"repeats": 1, "steps": 2, "warmup_steps": 1},
        "experiments": {"gres": {"base": dict(CELL, device="auto")}},
    }
    proc = snakemake(
        slurm_cluster, tmp_path, config, "bench:gres=gpu:tesla:1", "bench:gpu=0", "--verbose"
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    [call] = [
        line for line in proc.stderr.splitlines() if "sbatch call:" in line and "rule_bench" in line
    ]
    assert "--gres=gpu:tesla:1" in call and "--gpus" not in call, call
    [job] = bench_jobs(slurm_cluster, proc.stderr).values()
    assert job["State"] == "COMPLETED" and "gres/gpu=1" in job["AllocTRES"].split(","), job
    assert summary(tmp_path)["base"]["status"] == "ok"


# Three cells: one over in a second, two of 20 s that Slurm takes away mid-cell. Not longer: the
# next run runs those two again in full, and the plugin's status checks come 10 s further apart each
# time no job has ended (2, 14, 36, 68 s after the submission), so a cell of 40 s was seen done only
# after 68 s.
LOST = {
    "defaults": {"repeats": 1, "warmup_steps": 1, "device": "cpu"},
    "experiments": {
        "lost": {
            "title": "Cells lost to Slurm",
            "base": dict(CELL, steps=20),
            "matrix": {"compute_ms": [10, 1000, 1001]},
            "plot": {"x": "compute_ms", "kind": "bar"},
        },
    },
}
CANCELLED, NODE_FAILED = "compute_ms-1000", "compute_ms-1001"


def running_bench_jobs(slurm_cluster, log) -> dict[str, tuple[str, str]]:
    """cell -> (job id, node) of the bench jobs running now, by the job ids in the run's log so
    far."""
    cells = {job: key for key, job in submitted_bench_jobs(log.read_text()).items()}
    out = slurm_cluster.run("squeue", "-h", "-t", "running", "-o", "%i|%N").stdout
    running = dict(line.split("|") for line in out.splitlines())
    return {
        cells[job].removeprefix("lost_")[:-2]: (job, node)
        for job, node in running.items()
        if job in cells
    }


def kill_wait_s(slurm_cluster) -> float:
    """Slurm's KillWait: seconds between the SIGTERM and the SIGKILL of a job it ends."""
    config = slurm_cluster.run("scontrol", "show", "config").stdout
    return float(re.search(r"^KillWait\s*=\s*(\d+)", config, re.MULTILINE).group(1))


def job_processes(job_id: str) -> list[str]:
    """pid and command of every process on this host whose environment names Slurm job job_id (a
    job's processes inherit SLURM_JOB_ID, the harness's loader workers too), however it left the
    job's process tree."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            if f"SLURM_JOB_ID={job_id}".encode() in environ:
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ")[:200]
                found.append(f"{proc.name}: {command.decode(errors='replace')}")
        except OSError:  # not a process, or gone meanwhile
            continue
    return found


@pytest.fixture(scope="module")
def lost(slurm_cluster, tmp_path_factory):
    """LOST through profiles/slurm: one job scancel'ed, the node of another set down mid-cell; then
    run again."""
    workdir = tmp_path_factory.mktemp("slurm-lost")
    proc = snakemake(slurm_cluster, workdir, LOST, wait=False)
    down = None
    try:
        deadline = time.monotonic() + 240
        # The fast cell done first: Snakemake may submit it last, and on a loaded machine its job
        # (two torch imports) ran 8 s, on the node set down below, and was lost with it (CI,
        # 2026-11-28).
        fast = (
            workdir
            / "run"
            / "results"
            / "cells"
            / "lost"
            / "compute_ms-10"
            / "rep1"
            / "result.json"
        )
        both_since = None  # when both 20 s cells were first seen running
        while (
            both_since is None
            or not fast.exists()
            or len(running_bench_jobs(slurm_cluster, workdir / "snakemake.log")) != 2
        ):
            assert proc.poll() is None and time.monotonic() < deadline, (
                workdir / "snakemake.log"
            ).read_text()[-4000:]
            running = set(running_bench_jobs(slurm_cluster, workdir / "snakemake.log"))
            if both_since is None and {CANCELLED, NODE_FAILED} <= running:
                both_since = time.monotonic()
            time.sleep(1)
        time.sleep(max(0.0, both_since + 12 - time.monotonic()))  # a few of the 20 steps measured
        jobs = running_bench_jobs(slurm_cluster, workdir / "snakemake.log")
        slurm_cluster.run("scancel", jobs[CANCELLED][0])
        cancelled_at = time.monotonic()
        down = jobs[NODE_FAILED][1]
        # What slurmctld does when a node stops answering, without waiting SlurmdTimeout for it.
        slurm_cluster.run(
            "scontrol", "update", f"nodename={down}", "state=down", "reason=feedbench-test"
        )
        # Issue #36: once Slurm's KillWait (SIGTERM to SIGKILL) has passed, no process of the
        # cancelled job is left.
        time.sleep(max(0.0, cancelled_at + kill_wait_s(slurm_cluster) + 3 - time.monotonic()))
        left = job_processes(jobs[CANCELLED][0])
        first = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        if down:
            slurm_cluster.run("scontrol", "update", f"nodename={down}", "state=resume", check=False)
    log = (workdir / "snakemake.log").read_text()
    cells = workdir / "run" / "results" / "cells" / "lost"
    lost_records = {
        cell: json.loads((cells / cell / "rep1" / "lost.json").read_text())
        for cell in (CANCELLED, NODE_FAILED)
        if (cells / cell / "rep1" / "lost.json").exists()
    }
    first_summary = (
        summary(workdir) if (workdir / "run" / "results" / "summary.csv").exists() else {}
    )
    first_report = workdir / "run" / "results" / "report" / "index.html"
    first_report = first_report.read_text() if first_report.exists() else ""
    again = snakemake(slurm_cluster, workdir, LOST)
    stale = sorted(
        str(path.relative_to(cells))
        for path in cells.rglob("lost.json")
        if "attempts" not in path.parts
    )
    return dict(
        left=left,
        stale=stale,
        first=first,
        log=log,
        lost=lost_records,
        summary=first_summary,
        report=first_report,
        again=again,
        workdir=workdir,
    )


def test_lost_jobs_end_the_run_with_a_report_that_lists_them(lost):
    assert lost["first"] == 1, lost["log"][-6000:]
    assert "2 cell(s) lost on Slurm" in lost["log"], lost["log"][-6000:]
    rows = lost["summary"]
    assert {cell: row["status"] for cell, row in rows.items()} == {
        "compute_ms-10": "ok",
        CANCELLED: "failed",
        NODE_FAILED: "failed",
    }, rows
    assert "ended CANCELLED" in rows[CANCELLED]["error_message"], rows[CANCELLED]
    assert "ended NODE_FAIL" in rows[NODE_FAILED]["error_message"], rows[NODE_FAILED]
    assert "Failed cells" in lost["report"] and "NODE_FAIL" in lost["report"]
    for cell in (CANCELLED, NODE_FAILED):
        assert f"lost / {cell} / repeat 1: " in lost["report"], lost["report"][-3000:]


def test_no_process_of_a_cancelled_job_is_left_after_slurms_kill_wait(lost):
    """Issue #36: on a cluster that tracks processes by their parents (proctrack/linuxproc), a
    cancelled job's Snakemake once outlived its job by 27 min. Its batch script now execs Snakemake,
    Snakemake's SIGTERM cannot deadlock, and the bench job passes SIGTERM on to its harness and ends
    after it."""
    assert lost["left"] == [], lost["left"]


def test_every_lost_record_is_a_valid_result_naming_its_cell(lost):
    for cell, record in lost["lost"].items():
        assert invalid(record) is None, (cell, invalid(record))
        assert {k: record["requested"][k] for k in ("experiment", "cell", "repeat")} == {
            "experiment": "lost",
            "cell": cell,
            "repeat": 1,
        }
        # The harness's start, else the job's from sacct: never the moment the record was written.
        assert record["started_at"] and record["started_at"] < record["finished_at"], record[
            "error"
        ]["message"]


def test_a_lost_cell_keeps_what_it_measured_and_leaves_no_result_json(lost):
    assert set(lost["lost"]) == {CANCELLED, NODE_FAILED}
    # The cancelled harness had SIGTERM and KillWait's 5 s to write its result: kept, not deleted.
    cancelled = lost["lost"][CANCELLED]
    assert cancelled["error"]["type"] == "Terminated" and cancelled["metrics"]["steps"] > 0, (
        cancelled["error"]
    )


def test_the_next_run_runs_exactly_the_lost_cells_again(slurm_cluster, lost):
    again = lost["again"]
    assert again.returncode == 0, again.stderr[-6000:]
    assert set(bench_jobs(slurm_cluster, again.stderr)) == {
        f"lost_{CANCELLED}_1",
        f"lost_{NODE_FAILED}_1",
    }
    assert {cell: row["status"] for cell, row in summary(lost["workdir"]).items()} == {
        "compute_ms-10": "ok",
        CANCELLED: "ok",
        NODE_FAILED: "ok",
    }
    assert lost["stale"] == [], "a cell run again keeps no lost.json of its lost attempt"


def test_a_lost_attempt_is_kept_in_the_cells_attempts_and_the_report_says_attempt_2(lost):
    """Issue #36: the rerun that succeeds keeps the lost attempt (its record, steps, Slurm state and
    job id)."""
    cells = lost["workdir"] / "run" / "results" / "cells" / "lost"
    report = (lost["workdir"] / "run" / "results" / "report" / "index.html").read_text()
    for cell, state in ((CANCELLED, "CANCELLED"), (NODE_FAILED, "NODE_FAIL")):
        kept = cells / cell / "rep1" / "attempts" / "1"
        record = json.loads((kept / "lost.json").read_text())
        assert record["slurm"]["state"] == state and record["slurm"]["job_id"], record["slurm"]
        facts = json.loads((kept / "attempt.json").read_text())
        assert (facts["status"], facts["slurm_state"]) == ("lost", state), facts
        assert f"attempt 2; attempt 1 lost to {state} after {facts['steps']} step" in report, (
            report[-3000:]
        )
    steps = list(csv.DictReader(open(cells / CANCELLED / "rep1" / "attempts" / "1" / "steps.csv")))
    assert len(steps) == lost["lost"][CANCELLED]["metrics"]["steps"] > 0, (
        "the cancelled attempt's steps, kept"
    )
    for cell in (CANCELLED, NODE_FAILED):  # the figures of docs/reliability-slurm.md, row 9a
        record = json.loads((cells / cell / "rep1" / "attempts" / "1" / "lost.json").read_text())
        print(
            f"{cell}: "
            f"{json.loads((cells / cell / 'rep1' / 'attempts' / '1' / 'attempt.json').read_text())}"
        )
        print(f"{cell}: started {record['started_at']}, recorded {record['finished_at']}")


def test_a_sigterm_cancels_a_pending_job_records_it_lost_and_writes_the_report(
    slurm_cluster, tmp_path
):
    """Issue #36: `timeout`'s SIGTERM to a run whose only job waits on drained nodes. Snakemake
    alone would wait for the pending job; the workflow cancels it, records the cell lost (its start
    not known: it never ran), writes the report and exits 1."""
    config = {
        "defaults": {"repeats": 1, "warmup_steps": 1, "device": "cpu"},
        "experiments": {"pending": {"base": dict(CELL, steps=2)}},
    }
    nodes = slurm_cluster.run(
        "sinfo", "-h", "-p", slurm_cluster.partition, "-o", "%N"
    ).stdout.strip()
    slurm_cluster.run(
        "scontrol", "update", f"nodename={nodes}", "state=drain", "reason=feedbench-test"
    )
    proc = None
    try:
        proc = snakemake(slurm_cluster, tmp_path, config, wait=False)
        log = tmp_path / "snakemake.log"
        deadline = time.monotonic() + 180
        while not submitted_bench_jobs(log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(1)
        job = next(iter(submitted_bench_jobs(log.read_text()).values()))
        assert slurm_cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "PENDING"
        # no pending_timeout: it says why and waits
        said = wait_for_line(proc, log, "feedbench: pending: ", 60)
        assert (
            "pending: node down or drained" in said
            and "slurm.pending_timeout would cancel it" in said
        ), said
        sent = time.monotonic()
        proc.terminate()  # SIGTERM, as timeout(1) sends it
        code = proc.wait(timeout=180)
        took = time.monotonic() - sent
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        slurm_cluster.run("scontrol", "update", f"nodename={nodes}", "state=resume", check=False)
    output = log.read_text()
    assert code == 1, output[-4000:]
    assert slurm_cluster.wait(job, timeout=60)["State"].startswith("CANCELLED")
    cell = tmp_path / "run" / "results" / "cells" / "pending" / "base" / "rep1"
    record = json.loads((cell / "lost.json").read_text())
    assert record["slurm"]["job_id"] == job and record["started_at"] == "", record
    message = record["error"]["message"]
    assert message.startswith(f"Slurm job {job} ended CANCELLED") and message.endswith(
        "started is not known"
    ), message
    report = (tmp_path / "run" / "results" / "report" / "index.html").read_text()
    assert "pending / base / repeat 1: SlurmJobLost" in report, report[-3000:]
    # docs/reliability-slurm.md, row 9c
    print(f"SIGTERM to exit: {took:.0f} s; {record['error']['message']}")


def wait_for_line(proc, log, text: str, timeout: float) -> str:
    """The first line of the run's log that holds `text`, waiting for it at most `timeout` s while
    the run runs."""
    deadline = time.monotonic() + timeout
    while True:
        found = [line for line in log.read_text().splitlines() if text in line]
        if found:
            return found[0]
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(0.5)


def test_a_job_pending_on_a_down_node_says_why_and_is_given_up_at_the_pending_timeout(
    slurm_cluster, tmp_path
):
    """Issue #36: a 2-node cell submitted while one of the 2 nodes is drained. The run says why it
    waits within a minute; with slurm.pending_timeout (15 s here) it cancels the job, records the
    cell lost with that reason (not as CANCELLED), writes the report and exits 1."""
    config = {
        "defaults": {"repeats": 1, "warmup_steps": 1, "device": "cpu"},
        "slurm": {"pending_timeout": 0.25},
        "experiments": {"pend": {"base": dict(CELL, steps=2, parallel="ddp", nodes=2)}},
    }
    # Drained, not set DOWN: the test cluster returns a DOWN node that answers to service
    # (ReturnToService=2), and did so 0.2 s after the first try set it down. Slurm gives the job the
    # same reason for either.
    slurm_cluster.run("scontrol", "update", "nodename=n1", "state=drain", "reason=feedbench-test")
    proc = None
    try:
        proc = snakemake(slurm_cluster, tmp_path, config, wait=False)
        log = tmp_path / "snakemake.log"
        wait_for_line(proc, log, "submitted with SLURM jobid", 180)
        submitted = time.monotonic()
        said = wait_for_line(proc, log, "feedbench: pending: ", 60)
        said_after = time.monotonic() - submitted
        code = proc.wait(timeout=180)
        ended_after = time.monotonic() - submitted
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        slurm_cluster.run("scontrol", "update", "nodename=n1", "state=resume", check=False)
    output = log.read_text()
    job = submitted_bench_jobs(output)["pend_base_1"]
    assert (
        said.startswith("feedbench: pending: node down or drained") and f"(Slurm job {job})" in said
    ), said
    assert "pend/base/rep1" in said and "cancelled after 0.25 min of this" in said, said
    assert code == 1, output[-4000:]
    assert slurm_cluster.wait(job, timeout=60)["State"].startswith("CANCELLED")
    record = json.loads(
        (
            tmp_path / "run" / "results" / "cells" / "pend" / "base" / "rep1" / "lost.json"
        ).read_text()
    )
    assert invalid(record) is None and record["slurm"] == {"job_id": job, "state": "PENDING"}, (
        record["slurm"]
    )
    message = record["error"]["message"]
    assert (
        message.startswith(f"Slurm job {job} pending: node down") and "CANCELLED" not in message
    ), message
    report = (tmp_path / "run" / "results" / "report" / "index.html").read_text()
    assert "pend / base / repeat 1: SlurmJobLost" in report and "pending: node down" in report, (
        report[-3000:]
    )
    print(f"said after {said_after:.0f} s: {said}")  # docs/reliability-slurm.md, row 9d
    print(f"run ended after {ended_after:.0f} s; {message}")
