"""The bench rule's job (feedbench/plan/job.py): when a cell stops itself, and what a job leaves
behind."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT
from feedbench.core import attempts
from feedbench.plan import job, slurm
from feedbench.plan.job import CELL_DIR, CELL_LOG
from helpers.cells import ENDLESS_SLEEP, LABELLED, run_cell_process

WORKFLOW = os.path.join(ROOT, "workflow")


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("0:45", 45),
        ("12:03", 723),
        ("1:00:00", 3600),
        ("2-03:04:05", ((2 * 24 + 3) * 60 + 4) * 60 + 5),
        ("UNLIMITED", None),
        ("NOT_SET", None),
        ("", None),
    ],
)
def test_squeue_time_left_is_read_as_seconds(text, seconds):
    assert job.parse_time_left(text) == seconds


def test_outside_slurm_the_cell_stops_a_margin_before_the_rules_runtime():
    assert job.stop_at(30, now=1000.0, environ={}) == 1000.0 + 1800 - 180  # a tenth
    assert job.stop_at(2, now=1000.0, environ={}) == 1000.0 + 120 - 30  # at least 30 s
    # at most a quarter of the time left
    assert job.stop_at(1, now=1000.0, environ={}) == 1000.0 + 60 - 15


def test_inside_slurm_the_cell_stops_a_margin_before_the_jobs_own_end(tmp_path, monkeypatch):
    """The job's start-up (Snakemake twice, the imports) is counted: squeue says 40 s are left of a
    1-minute job, so the cell stops in 30 s (10 s before the end), or 2:00:00 of a 3-hour job, 18
    minutes before its end."""
    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\n[ \"$3\" = 4242 ] && echo '  0:40'\n")
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert job.stop_at(1, now=1000.0, environ={"SLURM_JOB_ID": "4242"}) == 1000.0 + 30
    squeue.write_text("#!/bin/sh\necho 2:00:00\n")
    assert job.stop_at(180, now=1000.0, environ={"SLURM_JOB_ID": "4242"}) == 1000.0 + 7200 - 1080
    # squeue cannot say (UNLIMITED, or no answer): the rule's runtime, as outside Slurm
    squeue.write_text("#!/bin/sh\necho UNLIMITED\n")
    assert job.stop_at(1, now=1000.0, environ={"SLURM_JOB_ID": "4242"}) == 1000.0 + 45


def feedbench(*args, cwd):
    env = dict(os.environ, PYTHONPATH=WORKFLOW)
    return subprocess.run(
        [sys.executable, "-m", "feedbench", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_job_writes_the_cell_and_its_result_and_keeps_the_earlier_attempt(tmp_path):
    out = tmp_path / "rep1"
    out.mkdir()
    (out / "trace.json").write_text("stale")
    (out / "steps.csv").write_text("step,total_ms\n0,1.0\n")
    # an earlier attempt, lost
    lost = slurm.lost_result(str(out / "result.json"), LABELLED, ("13", "CANCELLED"))
    (out / "lost.json").write_text(json.dumps(lost))
    cell = json.dumps(
        {
            "dataset": "synthetic",
            "model": "mlp",
            "steps": 2,
            "warmup_steps": 0,
            "torch_threads": 1,
            "data_dir": "img😀",
            "batch_size": 4,
        },
        ensure_ascii=False,
    )
    proc = feedbench(
        "job",
        str(out),
        "--cell",
        cell,
        "--runtime",
        "5",
        "--log",
        str(tmp_path / "log"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert (out / "cell.yaml").read_text(encoding="utf-8") == cell + "\n"
    assert not (out / "trace.json").exists() or (out / "trace.json").read_text() != "stale"
    assert json.loads((out / "result.json").read_text())["status"] == "ok", (
        tmp_path / "log"
    ).read_text()
    assert not (out / "lost.json").exists(), "the new result replaces the lost attempt's record"
    kept = out / "attempts" / "1"
    assert (
        json.loads((kept / "lost.json").read_text()) == lost
        and (kept / "trace.json").read_text() == "stale"
    )
    assert (kept / "steps.csv").read_text() == "step,total_ms\n0,1.0\n", (
        "the lost attempt's steps, kept"
    )
    assert attempts.earlier_text(str(out)) == "attempt 2; attempt 1 lost to CANCELLED after 1 step"


def test_a_job_finds_its_folder_and_log_from_the_cells_labels(tmp_path):
    """As rule bench runs it (two fields in its command): the folder and log are the rule's
    (CELL_DIR, CELL_LOG)."""
    cell = json.dumps(
        {
            "steps": 2,
            "warmup_steps": 0,
            "torch_threads": 1,
            "batch_size": 4,
            "experiment": "e",
            "cell": "c~1",
            "repeat": 2,
        }
    )
    proc = feedbench("job", "--cell", cell, "--runtime", "5", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    log = tmp_path / CELL_LOG.format(experiment="e", cell="c~1", repeat=2)
    result = tmp_path / CELL_DIR.format(experiment="e", cell="c~1", repeat=2) / "result.json"
    assert json.loads(result.read_text())["status"] == "ok", log.read_text()


@pytest.mark.parametrize("cell", ['{"steps": 2}', "not json", "[1]"])
def test_a_job_without_a_folder_and_a_cell_without_labels_is_one_line(tmp_path, cell):
    proc = feedbench("job", "--cell", cell, "--runtime", "5", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        proc.stderr.strip().count("\n") == 0
        and "allowed: a JSON mapping with the labels" in proc.stderr
    )
    assert list(tmp_path.iterdir()) == []  # nothing written


def start_job(out, log, cwd) -> tuple[subprocess.Popen, list[str]]:
    """`python -m feedbench job` on an endless sleep cell, and its harness's pid (pgrep: the job's
    child) once the harness has started and written to its log."""
    cell = json.dumps(dict(ENDLESS_SLEEP, compute_ms=100, dataset="memory"))
    command = [sys.executable, "-m", "feedbench", "job", str(out), "--cell", cell, "--runtime", "5"]
    env = dict(os.environ, PYTHONPATH=WORKFLOW)
    job_process = subprocess.Popen([*command, "--log", str(log)], cwd=cwd, env=env)
    harness, deadline = [], time.time() + 120
    while not (harness and log.exists() and log.stat().st_size) and time.time() < deadline:
        harness = subprocess.run(
            ["pgrep", "-P", str(job_process.pid)], capture_output=True, text=True
        ).stdout.split()
        time.sleep(0.2)
    return job_process, harness


def test_a_harness_killed_by_sigkill_gets_a_result_from_record_failure(tmp_path):
    """As from the OOM killer: the harness dies at once, without a result; the job still ends 0,
    with one."""
    out = tmp_path / "rep1"
    job_process, harness = start_job(out, tmp_path / "log", tmp_path)
    os.kill(int(harness[0]), signal.SIGKILL)
    assert job_process.wait(timeout=120) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "failed" and "(signal SIGKILL)" in result["error"]["message"], (
        result["error"]
    )


def test_a_sigterm_to_the_job_is_passed_to_its_harness_and_the_job_ends_after_it(tmp_path):
    """Slurm's SIGTERM may reach only the job process, or reach it after the processes above it
    died. It passes it on: the harness records what it measured, then the job ends 143 (a lost job
    to the run) and no harness outlives it."""
    out = tmp_path / "rep1"
    job_process, harness = start_job(out, tmp_path / "log", tmp_path)  # started: it says its notes
    time.sleep(1)  # a few steps of 100 ms
    job_process.send_signal(signal.SIGTERM)
    assert job_process.wait(timeout=60) == 128 + signal.SIGTERM
    assert not os.path.exists(f"/proc/{harness[0]}"), "the harness ended before the job"
    result = json.loads((out / "result.json").read_text())
    assert result["error"]["type"] == "Terminated" and "SIGTERM" in result["error"]["message"], (
        result["error"]
    )


def test_stop_at_is_counted_once_the_harness_has_started(tmp_path):
    """--stop-at 3 s ahead of a cell of minutes: it stops itself with the steps it measured. A
    start-up slower than 3 s (a busy machine) leaves it the least limit, 1 s (`feedbench run`), the
    same stop."""
    out = tmp_path / "rep1"
    start = time.time()
    cell = dict(ENDLESS_SLEEP, compute_ms=100, dataset="memory")
    env = dict(os.environ, PYTHONPATH=WORKFLOW)
    proc = run_cell_process(out, cell, "--stop-at", f"{time.time() + 3:.0f}", cwd=tmp_path, env=env)
    result = json.loads((out / "result.json").read_text())
    assert proc.returncode == 1 and result["error"]["type"] == "Terminated", proc.stderr
    assert result["error"]["message"].startswith("time limit of "), result["error"]
    assert time.time() - start < 120
