"""feedbench.plan.slurm without a cluster: the plugin workarounds and the record of a lost cell.

* Cells are matched to their jobs by what the run's log always holds (the plugin's submission line,
  Snakemake's error block for array tasks), never by the job comment, which sacct returns only with
  AccountingStoreFlags=job_comment.
* Every lost record is a result the schema accepts, whatever the harness wrote before its job ended,
  and the report names its experiment, cell and repeat.
* A pending job's reason in plain words, said at a bounded rate; one stuck past
  slurm.pending_timeout is given up and its record says "pending: node down ...", not CANCELLED.
* No orphans: a SIGTERM never deadlocks Snakemake, and a job's batch script execs its Snakemake; the
  status checks' sleep ends with the run and when a job has written its outputs.

See docs/reliability-slurm.md; the cluster runs are tests/workflow/test_slurm_faults.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from feedbench.core.result import invalid
from feedbench.plan import pending, slurm
from helpers.cells import LABELLED
from helpers.reports import text_report

plugin = pytest.importorskip("snakemake_executor_plugin_slurm")


def test_a_cancelled_job_reads_as_cancelled_through_the_plugins_own_status_query():
    # The plugin's query runs this command as it would run sacct; its output is sacct's for a
    # scancel'ed job.
    command = "printf " + shlex.quote("5|CANCELLED by 0\n6|COMPLETED\n")
    # unpatched, if patched before
    own = getattr(plugin.query_job_status, "feedbench", plugin.query_job_status)
    states, _ = asyncio.run(own(command, logging.getLogger("test")))
    # what the plugin compares with "CANCELLED": no match, waits forever
    assert states["5"] == "CANCELLED by 0"
    slurm.patch_plugin()
    slurm.patch_plugin()  # twice is once
    states, _ = asyncio.run(plugin.query_job_status(command, logging.getLogger("test")))
    assert states == {"5": "CANCELLED", "6": "COMPLETED"}
    # no "sacct: invalid option -- '1'"
    assert plugin.get_account(logging.getLogger("test")) is None


def test_a_preempted_job_ends_the_plugins_wait_unless_slurm_may_requeue_it():
    # The plugin waits on PREEMPTED for Slurm to requeue the job: forever, for a job submitted with
    # --no-requeue.
    command = "printf " + shlex.quote("7|PREEMPTED\n")
    try:
        slurm.patch_plugin(never_requeued=False)
        assert asyncio.run(plugin.query_job_status(command, logging.getLogger("test")))[0] == {
            "7": "PREEMPTED"
        }
        slurm.patch_plugin()
        assert asyncio.run(plugin.query_job_status(command, logging.getLogger("test")))[0] == {
            "7": "CANCELLED"
        }
    finally:
        slurm.patch_plugin()


def test_the_run_id_comes_from_snakemakes_logs(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("Building DAG of jobs...\nSLURM run ID: 1234-abcd\n")
    assert slurm.run_id(str(log)) == slurm.run_id([str(log)]) == "1234-abcd"
    assert slurm.run_id(None) is None and slurm.run_id([str(tmp_path / "missing")]) is None
    assert slurm.job_states("") == {}


def test_the_first_cell_wider_than_a_node_is_named():
    cells = [("a", "narrow", {"num_workers": 1}), ("b", "wide", {"num_workers": 4})]
    assert slurm.cells_fit_error(cells, "debug", 4) == (
        "bad config: experiments.b: cell wide asks for 5 CPUs per node (1 rank(s) x (num_workers "
        "4 + 1)); allowed: at most 4, the CPUs of a node in Slurm partition 'debug' (sinfo)"
    )
    assert slurm.cells_fit_error(cells[:1], "debug", 4) is None


# A run's log as Snakemake 9 and snakemake-executor-plugin-slurm 2.8 write it (taken from a run on
# the test cluster, shortened): two submissions, one failed job with its Slurm log, whose inner
# Snakemake run has an error block of its own (no external_jobid), and an array task's error block.
LOG = """\
SLURM run ID: 4a2c6a43-0dd9-4c8c-9e0e-a4b6c6b2d4f1
rule bench:
    output: results/cells/lost/compute_ms-1000/rep1/result.json
    jobid: 4
    wildcards: experiment=lost, cell=compute_ms-1000, repeat=1
Job 4 has been submitted with SLURM jobid 11 (log: /w/run/logs/slurm/rule_bench/lost_compute_ms-1000_1/11.log).
Job 3 has been submitted with SLURM jobid 12 (log: /w/run/logs/slurm/rule_bench/lost_compute_ms-10_1/12.log).
Job 5 has been submitted with SLURM jobid 13 (log: /w/run/logs/slurm/rule_other/lost_x_1/13.log).
[Wed Nov 25 12:19:01 2026]
Error in rule bench:
    message: SLURM-job '11' failed, SLURM status is: 'CANCELLED'. Reason: Unknown.
    jobid: 4
    output: results/cells/lost/compute_ms-1000/rep1/result.json
    shell:
        python -m feedbench job --cell '{"attempt": "first", "cell": "compute_ms-1000"}' --runtime 30
        (command exited with non-zero exit code)
    external_jobid: 11
Logfile /w/run/logs/slurm/rule_bench/lost_compute_ms-1000_1/11.log:
================================================================================
Error in rule bench:
    jobid: 0
    output: results/cells/lost/compute_ms-1000/rep1/result.json
================================================================================
Submitted array job with Snakemake IDs 7,8 and SLURM job ID 20. The individual task IDs are 1-2.
Error in rule bench:
    message: SLURM-job '20_2' failed, SLURM status is: 'NODE_FAIL'. Reason: Unknown.
    jobid: 8
    output: results/cells/arr_ay/seed-2/rep3/result.json
    external_jobid: 20_2
"""  # noqa: E501


def test_jobs_are_found_by_the_ids_the_log_names(tmp_path):
    log = tmp_path / "run.snakemake.log"
    log.write_text(LOG)
    assert slurm.run_id(str(log)) == "4a2c6a43-0dd9-4c8c-9e0e-a4b6c6b2d4f1"
    assert slurm.submitted_jobs(str(log)) == {
        "lost_compute_ms-1000_1": "11",
        "lost_compute_ms-10_1": "12",
        "arr_ay_seed-2_3": "20_2",
    }
    assert slurm.jobs_key("arr_ay", "seed-2", 3) == "arr_ay_seed-2_3"
    assert slurm.submitted_jobs([str(tmp_path / "missing.log")]) == {}


def test_the_cells_measured_on_the_targets_gpu_are_found_under_their_own_rule(tmp_path):
    """Rule bench_target runs the experiment target-compute (workflow/rules/bench.smk): its jobs are
    cells too."""
    assert slurm.bench_rule("target-compute") == "bench_target" and slurm.bench_rule("w") == "bench"
    log = tmp_path / "run.snakemake.log"
    log.write_text(
        "Job 2 has been submitted with SLURM jobid 31"
        " (log: /w/logs/slurm/rule_bench_target/target-compute_c_1/31.log).\n"
        "Error in rule bench_target:\n"
        "    output: results/cells/target-compute/d/rep2/result.json\n"
        "    external_jobid: 32_1\n"
    )
    assert slurm.submitted_jobs(str(log)) == {
        "target-compute_c_1": "31",
        "target-compute_d_2": "32_1",
    }


def test_a_cell_lost_before_its_harness_wrote_anything_is_a_valid_record_the_report_names(tmp_path):
    record = slurm.lost_result(str(tmp_path / "result.json"), LABELLED, ("11", "NODE_FAIL"))
    assert invalid(record) is None, invalid(record)
    assert record["error"]["message"].startswith("Slurm job 11 ended NODE_FAIL; the cell is lost")
    path = tmp_path / "lost.json"
    path.write_text(json.dumps(record))
    html = text_report(str(tmp_path), [str(path)], {"experiments": {"nodefail": {}}})
    assert "nodefail / seed-1 / repeat 1: SlurmJobLost" in html and "NODE_FAIL" in html, html[
        -3000:
    ]


def test_a_lost_record_starts_when_its_job_started_else_says_the_start_is_not_known(tmp_path):
    path = str(tmp_path / "result.json")
    started = slurm.slurm_time("2026-11-28T19:40:02")
    assert (
        started.endswith("+00:00")
        and slurm.slurm_time("Unknown") is None
        and slurm.slurm_time("N/A") is None
    )
    # Slurm 22.05 gives a job cancelled while pending a Start (its cancellation) but no node: no
    # start.
    assert (
        slurm.job_start("2026-11-28T19:48:51", "None assigned") is None
        and slurm.job_start("N/A", "") is None
    )
    assert slurm.job_start("2026-11-28T19:40:02", "n1") == started
    record = slurm.lost_result(path, LABELLED, ("11", "NODE_FAIL"), started)
    assert invalid(record) is None and record["started_at"] == started != record["finished_at"]
    assert "not known" not in record["error"]["message"]
    record = slurm.lost_result(path, LABELLED, ("12", "CANCELLED"), None)
    assert invalid(record) is None and record["started_at"] == "", record["started_at"]
    assert record["error"]["message"].endswith("when its job started is not known")


def test_a_harness_result_is_kept_with_its_steps_and_marked_failed(run_cell, tmp_path):
    code, measured = run_cell(
        **{k: v for k, v in LABELLED.items() if k not in ("cell", "repeat", "baseline")}
    )
    assert code == 0 and measured["status"] == "ok", measured["error"]
    path = tmp_path / "result.json"
    path.write_text(json.dumps(measured))
    record = slurm.lost_result(str(path), LABELLED, ("13", "TIMEOUT"))
    assert invalid(record) is None, invalid(record)
    assert record["status"] == "failed" and record["metrics"] == measured["metrics"]
    assert record["error"]["message"].startswith("Slurm job 13 ended TIMEOUT")
    assert record["error"]["message"].endswith("the harness said: nothing")


def test_a_damaged_harness_result_still_gives_a_valid_record(tmp_path):
    path = tmp_path / "result.json"
    path.write_text('{"schema_version": 1, "status": "ok", "metr')  # cut mid-write
    record = slurm.lost_result(str(path), LABELLED, ("14", "CANCELLED"))
    assert invalid(record) is None, invalid(record)
    assert "result.json was unusable (not valid JSON" in record["error"]["message"]
    record = slurm.lost_result(str(tmp_path / "none.json"), LABELLED, None)
    assert invalid(record) is None and record["error"]["message"].startswith("no Slurm job ran")


def test_sigterm_stops_the_run_as_ctrl_c_does_and_a_second_one_is_ignored():
    """The run's process (onstart): SIGTERM raises KeyboardInterrupt, on which Snakemake cancels the
    run's jobs; the cluster test is test_slurm_faults.test_a_sigterm_cancels_a_pending_job_..."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        slurm.stop_on_sigterm()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs before this ends
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)


# Pending jobs: the reasons as squeue gave them on the test cluster (Slurm 22.05).
DOWN = "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions"


def test_pending_reasons_are_said_in_plain_words_and_only_a_persons_ones_do_not_clear():
    assert pending.describe(DOWN) == (
        "node down or drained (or held for a higher-priority partition)",
        False,
    )
    assert pending.describe("ReqNodeNotAvail, UnavailableNodes:n[1-2]")[0].startswith(
        "node down or drained"
    )
    assert pending.describe("ReqNodeNotAvail, Reserved for maintenance") == (
        "reservation: the nodes are reserved for maintenance",
        True,
    )
    assert pending.describe("PartitionNodeLimit") == (
        "the partition can never give it: more nodes than the partition allows",
        False,
    )
    assert (
        not pending.describe("PartitionTimeLimit")[1]
        and not pending.describe("QOSMaxWallDurationPerJobLimit")[1]
    )
    for reason in ("Priority", "Resources", "Reservation", "AssocGrpCpuLimit"):
        assert pending.describe(reason)[1], reason
    assert pending.said("PartitionConfig; odd") == (
        "pending: the partition can never give what it asks (its configuration) (Slurm: "
        "PartitionConfig, odd)"
    )


def test_a_pending_reason_is_said_when_first_seen_when_it_changes_and_every_5_minutes():
    watch = pending.Watch(timeout_s=None)
    assert watch.update({"7": "None"}, 0) == ([], {})  # not looked at by the scheduler yet
    assert watch.update({"7": "Priority", "8": DOWN}, 1) == (["7", "8"], {})
    assert watch.update({"7": "Priority", "8": DOWN}, 60) == ([], {})
    assert watch.update({"7": "Resources", "8": DOWN}, 120) == (["7"], {})
    assert watch.update({"7": "Resources", "8": DOWN}, 1 + pending.NOTICE_EVERY_S) == (["8"], {})
    assert watch.update({"8": DOWN}, 3600)[1] == {}, "no limit: it waits"
    assert set(watch.seen) == {"8"}, "a job no longer pending is forgotten"
    lines = pending.notices(["8", "9"], {"8": DOWN, "9": DOWN}, {"8": "e/c/rep1"}, None)
    assert lines == [
        f"feedbench: {pending.said(DOWN)}: e/c/rep1 (Slurm job 8), a job (Slurm job 9); it will "
        "not start until an administrator acts; slurm.pending_timeout would cancel it"
    ]


def test_a_job_stuck_past_the_pending_timeout_is_given_up_and_one_that_may_start_is_not():
    watch = pending.Watch(timeout_s=60)
    watch.update({"7": "Priority", "8": DOWN, "9": "ReqNodeNotAvail, UnavailableNodes:n1"}, 0)
    assert watch.update({"7": "Priority", "8": DOWN, "9": DOWN}, 59)[1] == {}
    tell, give_up = watch.update({"7": "Priority", "8": DOWN, "9": DOWN}, 61)
    assert set(give_up) == {"8", "9"}, (
        "a change between reasons a person must clear keeps the count going"
    )
    assert give_up["8"] == f"{pending.said(DOWN)} for 61 s, past slurm.pending_timeout (1 min)"
    assert give_up["8"].startswith("pending: node down")
    watch.update({"10": DOWN}, 100)
    # the node came back: the count starts again when it is down again
    watch.update({"10": "Resources"}, 150)
    assert watch.update({"10": DOWN}, 170)[1] == {} and set(watch.update({"10": DOWN}, 230)[1]) == {
        "10"
    }


def test_a_job_given_up_while_pending_is_lost_with_its_reason_not_as_cancelled(tmp_path):
    why = f"{pending.said(DOWN)} for 62 s, past slurm.pending_timeout (1 min)"
    line = f"feedbench: pend/base/rep1 (Slurm job 12) cancelled, {why}"
    log = tmp_path / "snakemake.log"
    # The run's log: the line, then Snakemake's error block repeating it with the plugin's words
    # after it.
    log.write_text(
        f"{line}\nError in rule bench:\n    message: {line}. For further error "
        "details see the log\n"
    )
    assert slurm.given_up(str(log)) == {"12": why}
    record = slurm.lost_result(
        str(tmp_path / "result.json"), LABELLED, ("12", "PENDING"), None, why
    )
    assert invalid(record) is None and record["slurm"] == {"job_id": "12", "state": "PENDING"}
    message = record["error"]["message"]
    assert message.startswith(f"Slurm job 12 pending: node down or drained (or held for a higher-priority partition) "  # noqa: E501
                              f"(Slurm: {DOWN}) for 62 s") and "CANCELLED" not in message, message  # fmt: skip  # noqa: E501


def test_a_sigterm_while_snakemake_finishes_a_job_ends_it_instead_of_deadlocking_it(tmp_path):
    """Snakemake 9's SIGTERM handler takes the scheduler's lock, which its main thread holds while
    it waits for a job's missing outputs: unpatched, the run below never ends and ignores every
    later SIGTERM (the orphan of issue #36, docs/upstream/sigterm-deadlock.md). Patched, it ends
    once that wait is over."""
    (tmp_path / "Snakefile").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(slurm.__file__).parents[2])!r})\n"
        "from feedbench.plan.slurm import sigterm_without_deadlock\n"
        "sigterm_without_deadlock()\n"
        "rule a:\n    output: 'out'\n    shell: 'true'\n"
    )
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "-c1",
        "--latency-wait",
        "3",
        "-s",
        str(tmp_path / "Snakefile"),
    ]
    log = tmp_path / "snakemake.log"
    proc = subprocess.Popen(
        [*command, "--directory", str(tmp_path)], stdout=open(log, "w"), stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 60
        while "Waiting at most 3 seconds for missing files" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)  # while the main thread holds the scheduler's lock
        assert proc.wait(timeout=30) == 1, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_jobs_batch_script_execs_its_snakemake():
    """The batch script's shell is replaced by the job-side Snakemake, so that no SIGTERM leaves
    that Snakemake with parent 1, beyond Slurm's SIGKILL on clusters that track processes by their
    parents."""

    class Executor:
        def get_python_executable(self):
            return "/venv/bin/python"

        def format_job_exec(self, job):
            return job

    slurm.exec_batch(Executor)
    slurm.exec_batch(Executor)  # twice is once
    assert Executor().format_job_exec("/venv/bin/python -m snakemake --snakefile S") == (
        "exec /venv/bin/python -m snakemake --snakefile S"
    )
    assert Executor().format_job_exec("module load x && /venv/bin/python -m snakemake") == (
        "module load x && /venv/bin/python -m snakemake"
    )


def test_the_status_checks_sleep_ends_with_the_run_and_when_a_job_has_written_its_outputs(
    tmp_path, monkeypatch
):
    """Issue #36 item 5: the run's end waited out the plugin's status interval (18 s after its last
    rule), and a job was seen ending up to one interval late. The interface's own sleep, patched, on
    a stand-in for the executor's state: 3 s asked, it returns when `wait` turns false, or once a
    job in flight has all its outputs (3 times)."""
    from types import SimpleNamespace

    from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

    slurm.check_soon_and_end_at_once()
    slurm.check_soon_and_end_at_once()  # twice is once
    # 2 s on a cluster: shorter here to keep the test short
    monkeypatch.setattr(slurm, "OUTPUTS_POLL_S", 0.5)
    output = tmp_path / "result.json"
    job = SimpleNamespace(external_jobid="7", job=SimpleNamespace(output=[str(output)]))
    executor = SimpleNamespace(wait=True, next_seconds_between_status_checks=3, active_jobs=[job])

    async def stop_soon():
        await asyncio.sleep(0.3)
        executor.wait = False

    async def timed(*also) -> float:
        start = time.monotonic()
        await asyncio.gather(RemoteExecutor.sleep(executor), *also)
        return time.monotonic() - start

    assert asyncio.run(timed(stop_soon())) < 1.5, "the run's end waits at most one 0.5 s slice"
    executor.wait = True
    output.write_text("{}")
    took = [asyncio.run(timed()) for _ in range(4)]
    assert all(t < 2 for t in took[:3]) and took[3] >= 3, took
