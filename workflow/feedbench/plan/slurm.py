"""What the workflow does on a Slurm cluster beyond the executor plugin: docs/reliability-slurm.md.

* Before any job: refuse a cell that needs more CPUs per node than the
  partition's nodes have (sbatch would reject it and the run end without a report).
* Workarounds for snakemake-executor-plugin-slurm 2.8 (docs/upstream/):
  a job cancelled with scancel ("CANCELLED by 0" in sacct) counts as failed
  instead of running forever, and so does a preempted one when requeue is off
  (the profile's default); a failed node list of "None assigned" is never
  passed to sbatch --exclude; the account guess, whose sacct call cannot work,
  is skipped quietly (sbatch then charges the user's default account).
* No orphans (docs/reliability-slurm.md): every Snakemake process, the job-side ones too, answers
  SIGTERM without the deadlock of Snakemake 9's handler (sigterm_without_deadlock), and the job's
  batch script execs its Snakemake, so that Slurm's SIGKILL after KillWait reaches it on clusters
  that track processes by their parents (exec_batch).
* While a job is pending: its reason from squeue, in plain words, said when first seen and every 5
  minutes; a job pending past the config's slurm.pending_timeout for a reason that does not clear by
  itself (a node down, a partition that can never give what it asks) is cancelled and its cell lost
  "pending: node down ..." (plan.pending).
* After a run in which jobs were lost (NODE_FAIL, cancelled, timed out, refused
  by sbatch): each lost cell gets a lost.json saying its Slurm state, and the
  summary and report are made from every result plus those, so the report
  lists them. A lost cell has no result.json, so the next run runs it again.
  Cells are matched to their jobs by the job ids the run's log names, so this
  works whatever the cluster's accounting keeps (job comments need a flag).

No torch: the Snakefile imports this module.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable

from ..core import resources
from ..core.target import MEASURED_EXPERIMENT, MEASURED_RULE
from . import pending


def on_slurm(workflow) -> bool:
    """Whether this Snakemake process submits jobs to Slurm (not a job, not a dry run)."""
    plugin = workflow.executor_plugin
    return plugin is not None and plugin.name == "slurm" and not workflow.dryrun


# The rules whose jobs are cells (workflow/rules/bench.smk): bench, and bench_target for the cells
# measured on the target's GPU (experiment MEASURED_EXPERIMENT), which may ask for a partition of
# their own.
BENCH_RULE = "bench"
BENCH_RULES = (BENCH_RULE, MEASURED_RULE)
# How the run's log names them (submitted_jobs): the plugin's log folder of each rule, Snakemake's
# error block.
BENCH_LOG_FOLDERS = frozenset(f"rule_{rule}" for rule in BENCH_RULES)
BENCH_ERRORS = tuple(f"Error in rule {rule}:" for rule in BENCH_RULES)


def bench_rule(experiment: str) -> str:
    """The rule whose jobs run an experiment's cells (as bench.smk's wildcard constraint and
    ruleorder route them)."""
    return MEASURED_RULE if experiment == MEASURED_EXPERIMENT else BENCH_RULE


def rule_resource(workflow, rule: str, name: str):
    """A resource of a rule as Snakemake resolved it (--set-resources, else the rule's own, else
    default-resources), as given: "debug" or "'debug'" are debug; not evaluated outside a job. None
    where none is given."""
    value = workflow.get_rule(rule).resources.get(name)
    value = getattr(value, "raw", value)
    return str(value).strip("'\"") if value not in (None, "") else None


def node_cpus(partition: str | None, where: str = "slurm_partition") -> tuple[str, int]:
    """The partition (given, or the cluster's default) and the most CPUs one of its nodes has, from
    sinfo; `where` names the partition's setting in the error for one that is not there."""
    lines = subprocess.run(
        ["sinfo", "-h", "-o", "%P %c"], capture_output=True, text=True, check=True, timeout=60
    )
    cpus: dict[str, int] = {}
    default = None
    for line in lines.stdout.splitlines():
        name, count = line.split()
        if name.endswith("*"):
            name = default = name[:-1]
        cpus[name] = max(cpus.get(name, 0), int(count.rstrip("+")))
    partition = partition or default
    if partition not in cpus:
        known = ", ".join(sorted(cpus))
        raise ValueError(f"bad config: {where}: '{partition}' is not a partition; allowed: {known}")
    return partition, cpus[partition]


def cells_fit_error(
    cells: Iterable[tuple[str, str, dict]], partition: str, cpus: int
) -> str | None:
    """One line for the first cell (experiment, id, knobs) that needs more CPUs per node than there
    are."""
    for experiment, cell, knobs in cells:
        error = resources.node_fit_error(knobs, cpus, partition)
        if error:
            return f"bad config: experiments.{experiment}: cell {cell} {error}"
    return None


def check_cells_fit(workflow, cells: Iterable[tuple[str, str, dict]]) -> str | None:
    """Before any job (the Snakefile's onstart, on Slurm): one line for a cell (experiment, id,
    knobs) that needs more CPUs per node than its rule's partition's nodes have, or for a partition
    that is not there, else None. Without sinfo, one line on stderr, and sbatch judges."""
    by_rule: dict[str, list] = {}
    for cell in cells:
        by_rule.setdefault(bench_rule(cell[0]), []).append(cell)
    for rule, group in by_rule.items():
        where = (
            "slurm_partition"
            if rule == BENCH_RULE
            else f"slurm_partition of rule {rule} (target.partition, or set-resources {rule}"
            ":slurm_partition)"
        )
        try:
            partition, cpus = node_cpus(rule_resource(workflow, rule, "slurm_partition"), where)
        except ValueError as error:  # no such partition
            return str(error)
        except (OSError, subprocess.SubprocessError) as error:
            print(
                f"feedbench: cannot read the nodes' CPUs with sinfo ({error}); cells not checked",
                file=sys.stderr,
            )
            return None
        error = cells_fit_error(group, partition, cpus)
        if error:
            return error
    return None


# Plugin workarounds ---------------------------------------------------------


def _state(status: str) -> str:
    """sacct's "CANCELLED by 0" is the state CANCELLED; the plugin compares the whole text."""
    return status.split(" by ")[0]


def _plugin_state(status: str) -> str:
    """The state as the plugin should see it. PREEMPTED is final for the workflow's jobs, which are
    never requeued (the profile's slurm-no-requeue): the plugin would wait for Slurm to requeue it,
    forever, so it reads as CANCELLED, a state it ends the job on. The lost cell's record still
    names PREEMPTED (job_states asks Slurm)."""
    state = _state(status)
    return "CANCELLED" if state == "PREEMPTED" else state


def patch_plugin(never_requeued: bool = True, pending_timeout: float | None = None) -> None:
    """Apply the workarounds to the loaded plugin (docs/upstream/ has the reports to send).
    never_requeued: jobs are submitted with --no-requeue (the profile's slurm-no-requeue). Else
    Slurm may requeue a PREEMPTED job, the plugin's wait for it is right, and is kept.
    pending_timeout: the config's slurm.pending_timeout, minutes (watch_pending)."""
    import snakemake_executor_plugin_slurm as plugin

    watch_pending(plugin.Executor, pending.Watch(pending_timeout * 60 if pending_timeout else None))
    exec_batch(plugin.Executor)

    query = plugin.query_job_status
    # patched before: the plugin's own query beneath
    if getattr(query, "feedbench", None) is not None:
        query = query.feedbench
    read = _plugin_state if never_requeued else _state

    async def query_job_status(command, logger):
        states, duration = await query(command, logger)
        return (
            {job: read(status) for job, status in states.items()} if states is not None else None
        ), duration

    query_job_status.feedbench = query
    plugin.query_job_status = query_job_status

    submit = plugin.get_submit_command
    if not getattr(submit, "feedbench", False):

        def get_submit_command(job, params, settings=None, failed_nodes=None, array_job=False):
            # never "None assigned"
            nodes = {node for node in failed_nodes or () if node and " " not in node}
            return submit(job, params, settings=settings, failed_nodes=nodes, array_job=array_job)

        get_submit_command.feedbench = True
        plugin.get_submit_command = get_submit_command

    plugin.get_account = lambda logger: None


def watch_pending(executor_class, watch: pending.Watch) -> None:
    """At each of the plugin's status checks, after its own: the run's pending jobs' reasons from
    squeue, said when first seen and every few minutes, and the jobs stuck past the user's limit
    cancelled and reported failed (the plugin has no hook for either:
    docs/upstream/pending-reason.md). Its checks come 20 s after a submission (the profile), then up
    to 180 s apart: they set how soon a reason is said and a job given up."""
    check = getattr(executor_class.check_active_jobs, "feedbench", executor_class.check_active_jobs)

    async def check_active_jobs(self, active_jobs):
        still = [job async for job in check(self, active_jobs)]
        for job in _pending_checked(self, watch, still):
            yield job

    check_active_jobs.feedbench = check
    executor_class.check_active_jobs = check_active_jobs


def _job_name(job) -> str:
    """A job as the run's user knows it: a cell's experiment/cell/repK, else its rule and
    wildcards."""
    wildcards = dict(getattr(job, "wildcards", None) or {})
    if {"experiment", "cell", "repeat"} <= set(wildcards):
        return f"{wildcards['experiment']}/{wildcards['cell']}/rep{wildcards['repeat']}"
    return " ".join([job.name, *(f"{key}={value}" for key, value in wildcards.items())])


def _pending_checked(executor, watch: pending.Watch, jobs: list) -> list:
    """The jobs still active after watch's notices and give-ups (pending.Watch), each said in the
    run's log."""
    reasons = pending_reasons(executor.run_uuid) if jobs else None
    if not reasons:
        return jobs
    by_id = {job.external_jobid: job for job in jobs if job.external_jobid in reasons}
    reasons = {job: reason for job, reason in reasons.items() if job in by_id}
    tell, give_up = watch.update(reasons, time.monotonic())
    names = {job: _job_name(info.job) for job, info in by_id.items()}
    for line in pending.notices(tell, reasons, names, watch.timeout_s):
        executor.logger.warning(line)
    kept = []
    for job in jobs:
        why = give_up.get(job.external_jobid)
        if why and cancel_pending(job.external_jobid):
            line = (
                f"feedbench: {names[job.external_jobid]} (Slurm job {job.external_jobid}) "
                f"cancelled, {why}"
            )
            executor.logger.error(line)  # record_lost_cells reads it back (GAVE_UP)
            executor.report_job_error(job, msg=line + ". ")
        else:
            kept.append(job)
    return kept


def pending_reasons(run: str) -> dict[str, str] | None:
    """job id -> squeue's reason (%r) of each pending job of the run, array tasks one each ("13_2");
    None where squeue cannot say."""
    command = ["squeue", "-h", "-r", "-t", "PENDING", "--name", run, "-o", "%i|%r"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return dict(line.split("|", 1) for line in out.stdout.splitlines() if "|" in line)


def cancel_pending(job: str) -> bool:
    """Cancel the job if it is still pending (scancel --state=PENDING leaves one that has just
    started); whether it is cancelled now."""
    try:
        subprocess.run(["scancel", "--state=PENDING", job], capture_output=True, timeout=60)
        command = ["squeue", "-h", "--states=all", "-j", job, "-o", "%T"]
        out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.stdout.strip() == "CANCELLED"


def stop_on_sigterm() -> None:
    """SIGTERM (`timeout`, a login node's session limit, a CI runner) stops the run as Ctrl-C does:
    Snakemake's own SIGTERM handler only stops submitting and waits for the jobs it has, pending
    ones too, which may wait forever. As KeyboardInterrupt, Snakemake cancels every job of the run
    (the plugin's scancel), then onerror records them lost and writes the report, and the run exits
    1. A second SIGTERM is ignored, so that it cannot cut the report short (SIGKILL still ends the
    run). Called from onstart: Snakemake installs its handler before."""

    def interrupt(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(
            "feedbench: SIGTERM: cancelling the run's Slurm jobs, then the report", file=sys.stderr
        )
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def sigterm_without_deadlock() -> None:
    """Snakemake's SIGTERM handler (JobScheduler.exit_gracefully: stop submitting, exit once the
    running jobs end) takes the scheduler's lock, which the main thread holds while it finishes or
    fails a job (for up to --latency-wait seconds while outputs are missing). A SIGTERM then runs
    the handler in that thread, which waits for itself for ever, and for every later SIGTERM too:
    only SIGKILL ends it (docs/upstream/sigterm-deadlock.md). The same handler without the lock: its
    flag is one assignment, which the scheduler reads on its next round. Called as the Snakefile is
    read, before Snakemake builds its scheduler, in every Snakemake process, the job-side ones in a
    Slurm job too (stop_on_sigterm replaces it later on the submitting side)."""
    from snakemake.scheduling.job_scheduler import JobScheduler

    if getattr(JobScheduler.exit_gracefully, "feedbench", False):
        return

    def exit_gracefully(self, *args):
        self._user_kill = "graceful"
        self._open_jobs.release()

    exit_gracefully.feedbench = True
    JobScheduler.exit_gracefully = exit_gracefully


def exec_batch(executor_class) -> None:
    """The job's batch script (`#!/bin/sh` and the job-side Snakemake command) runs that command
    with exec: the shell would die of Slurm's SIGTERM at once and leave the Snakemake beneath it
    with parent 1, beyond Slurm's SIGKILL where processes are tracked by their parents
    (ProctrackType=proctrack/linuxproc). A command that does not start with the plugin's Python (a
    precommand) is left as it is."""
    format_job_exec = getattr(
        executor_class.format_job_exec, "feedbench", executor_class.format_job_exec
    )

    def exec_job(self, job):
        command = format_job_exec(self, job)
        python = f"{self.get_python_executable()} -m snakemake"
        return f"exec {command}" if command.startswith(python) else command

    exec_job.feedbench = format_job_exec
    executor_class.format_job_exec = exec_job


# How often the status checks' sleep looks whether the run ends: how late the end may come after the
# last rule.
SHUTDOWN_POLL_S = 0.5
# How often it looks whether a job has written its outputs (one stat per output of each job in
# flight), and how many early checks one job may cost: one that lingers after writing them makes a
# few more queries, not one every 2 s.
OUTPUTS_POLL_S = 2.0
EARLY_CHECKS = 3


def check_soon_and_end_at_once() -> None:
    """The plugin's status checks sleep their interval between two checks: 20 s, growing by 10 s up
    to 180 s while no job ends (the profile's slurm-init-seconds-before-status-checks). A run saw
    its last job end 19 s late, and ended 18 s after its last rule: Snakemake's end
    (RemoteExecutor.shutdown) joins the checks' thread, which sees that the run ends only after its
    sleep (docs/reliability-slurm.md, "The end of a run"; docs/upstream/status-sleep.md). The same
    sleep, cut short when the executor stops waiting for jobs, and when a job in flight has written
    all its outputs (Snakemake removes them before a job starts, so they are this job's): Slurm says
    it ended a moment later. The sleep of every remote executor (the plugin's is the interface's),
    in place as the Snakefile is read: the checks' first sleep starts before onstart."""
    from snakemake_interface_executor_plugins.executors.remote import (
        RemoteExecutor as executor_class,
    )

    if getattr(executor_class.sleep, "feedbench", False):
        return

    async def sleep(self):
        start = time.monotonic()
        deadline, looked = start + self.next_seconds_between_status_checks, start
        early = self.__dict__.setdefault("_feedbench_early_checks", {})
        while self.wait and time.monotonic() < deadline:
            await asyncio.sleep(min(SHUTDOWN_POLL_S, max(0.0, deadline - time.monotonic())))
            if time.monotonic() - looked >= OUTPUTS_POLL_S:
                looked = time.monotonic()
                if _outputs_written(list(self.active_jobs), early):
                    return

    sleep.feedbench = True
    executor_class.sleep = sleep


def _outputs_written(active_jobs, early: dict) -> bool:
    """Whether a job in flight has written all its outputs and may still be checked early (early:
    job id -> early checks so far, counted here)."""
    for job_info in active_jobs:
        key = job_info.external_jobid
        outputs = list(job_info.job.output)
        if (
            early.get(key, 0) < EARLY_CHECKS
            and outputs
            and all(os.path.exists(path) for path in outputs)
        ):
            early[key] = early.get(key, 0) + 1
            return True
    return False


# Lost cells -----------------------------------------------------------------


def _log_lines(logs) -> list[str]:
    """The lines of Snakemake's log of the run (one path, or a list of them); unreadable ones are
    skipped."""
    lines = []
    for path in [logs] if isinstance(logs, (str, os.PathLike)) else list(logs or []):
        try:
            with open(path, errors="replace") as f:
                lines += f.read().splitlines()
        except OSError:
            continue
    return lines


def run_id(logs) -> str | None:
    """The plugin's run id (every job's name) from Snakemake's log of the run."""
    found = [
        m.group(1)
        for line in _log_lines(logs)
        for m in [re.search(r"SLURM run ID: (\S+)", line)]
        if m
    ]
    return found[-1] if found else None


# How a run's log names the Slurm job of each cell (rule bench or bench_target), whatever the
# cluster's accounting keeps (the job comment, rule and wildcards, comes back from sacct only with
# AccountingStoreFlags=job_comment, which sites rarely set):
# * the plugin, for each job it submits: "Job 3 has been submitted with SLURM jobid 13 (log:
#   logs/slurm/rule_bench/<wildcards joined by _>/13.log)."
# * Snakemake, for each job that failed, array tasks too: an "Error in rule bench:" block with
#   "output: <result.json>" and "external_jobid: 13" (or "13_2"), indented under it.
SUBMITTED = re.compile(r"has been submitted with SLURM jobid (\S+) \(log: (.+)\)\.?\s*$")
RESULT = re.compile(r"results/cells/([^/]+)/([^/]+)/rep(\d+)/result\.json")


def submitted_jobs(logs) -> dict[str, str]:
    """jobs_key -> Slurm job id of each cell's job (rules BENCH_RULES) this run submitted (the last
    one of each)."""
    jobs, error = {}, None
    for line in _log_lines(logs):
        match = SUBMITTED.search(line)
        if match:
            folder = os.path.dirname(match.group(2))
            if os.path.basename(os.path.dirname(folder)) in BENCH_LOG_FOLDERS:
                jobs[os.path.basename(folder)] = match.group(1)
        elif line.startswith(BENCH_ERRORS):
            error = {}
        elif error is not None and line.startswith("    "):
            key, _, value = line.strip().partition(": ")
            error[key] = value
            cell = RESULT.search(error.get("output", ""))
            if key == "external_jobid" and cell:
                jobs[jobs_key(cell[1], cell[2], int(cell[3]))] = value
        elif error is not None and line.strip():
            error = None
    return jobs


# The line _pending_checked logs for a job it gave up on: its id and why ("pending: node down ...
# for 62 s, ...").
GAVE_UP = re.compile(r"feedbench: .* \(Slurm job (\S+)\) cancelled, (pending: .+)$")


def given_up(logs) -> dict[str, str]:
    """job id -> why, for each job the run cancelled as pending past slurm.pending_timeout (its
    first line: Snakemake repeats it in its error block, with more text after it)."""
    found: dict[str, str] = {}
    for line in _log_lines(logs):
        match = GAVE_UP.match(line)
        if match:
            found.setdefault(match.group(1), match.group(2).rstrip(". "))
    return found


def jobs_key(experiment: str, cell: str, repeat: int) -> str:
    """The folder of a cell's Slurm log under logs/slurm/rule_<its rule>/: its wildcards joined by
    _, as the plugin names it (utils.get_job_wildcards)."""
    return "_".join((experiment, cell, str(repeat))).replace("/", "_")


def slurm_time(text: str) -> str | None:
    """sacct's or squeue's time (local, "2026-11-28T19:40:02") as the results' UTC ISO text; None
    for "Unknown", "None", "N/A" or anything else that is no time."""
    try:
        moment = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    return moment.astimezone(datetime.timezone.utc).isoformat(timespec="seconds")


def job_start(start: str, nodes: str) -> str | None:
    """A job's start (slurm_time) when it ran on a node, else None: a job cancelled while pending
    has no node ("None assigned" in sacct, nothing in squeue) and a Start that is its cancellation
    (Slurm 22.05)."""
    return slurm_time(start) if nodes.strip() not in ("", "None assigned", "(null)") else None


def job_states(run: str) -> dict[str, tuple[str, str | None]]:
    """job id -> (state, start: job_start) of the run's jobs (every job of a run is named after the
    run): sacct's, then squeue's for the jobs sacct lacks (slurmdbd learns of a job seconds after
    slurmctld: a job cancelled right after its submission is in squeue only).

    Ids as sbatch gave them, "13", or as the plugin names an array's task, "13_2" (sacct's JobID,
    squeue's %i)."""
    if not run:
        return {}
    commands = [
        [
            "sacct",
            "-X",
            "-P",
            "-n",
            "--starttime",
            "now-7days",
            "--name",
            run,
            "-o",
            "JobID,State,Start,NodeList",
        ],
        ["squeue", "-h", "--states=all", "--name", run, "-o", "%i|%T|%S|%N"],
    ]
    found: dict[str, tuple[str, str | None]] = {}
    for command in commands:
        if shutil.which(command[0]) is None:
            continue
        out = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            continue
        for job, state, start, nodes in (line.split("|", 3) for line in out.stdout.splitlines()):
            found.setdefault(job, (_state(state), job_start(start, nodes)))
    return found


# A job that ends in any other state lost its cell, even when the harness wrote a result first (a
# job cancelled or timed out after the harness finished): the cell is recorded lost and run again.
FINISHED = "COMPLETED"


def lost_result(
    result_path: str,
    labelled: dict,
    job: tuple[str, str] | None,
    started: str | None = None,
    why: str | None = None,
) -> dict:
    """The record of a lost cell, valid against the result schema: the harness's own result when it
    wrote a usable one (kept by keep-incomplete, with the steps it measured), marked failed; else an
    empty failed result saying why, whose started_at is the job's start from Slurm (`started`), or
    empty when Slurm does not know it (the job never started, or no accounting). `job`: (id, state);
    the record keeps them as `slurm` (core.attempts reads them). `why`: how the job ended when the
    run ended it (given_up), in place of its state."""
    # result.py loads jsonschema: only when cells were lost
    from ..core.result import UnusableResult, failed_result, invalid, now, read_result

    if job:
        how = f"Slurm job {job[0]} {why}" if why else f"Slurm job {job[0]} ended {job[1]}"
    else:
        how = "no Slurm job ran (sbatch refused it, or the run stopped)"
    message = f"{how}; the cell is lost and the next run runs it again"
    slurm = {"job_id": job[0], "state": job[1]} if job else {"job_id": None, "state": None}
    if os.path.exists(result_path):
        try:
            result = read_result(result_path)
            error = result.get("error") or {}
            said = f"; the harness said: {error.get('message', 'nothing')}"
            error = dict(error, type=error.get("type") or "SlurmJobLost", message=message + said)
            record = dict(
                result,
                status="failed",
                error=dict(error, traceback=error.get("traceback", "")),
                slurm=slurm,
            )
            if invalid(record) is None:
                return record
            message += "; the harness's result could not be kept"
        except UnusableResult as damage:
            message += f"; the harness's result.json was unusable ({damage.reason})"
    if not started:
        message += "; when its job started is not known"
    record = dict(
        failed_result(labelled, labelled), started_at=started or "", finished_at=now(), slurm=slurm
    )
    record["error"] = {"type": "SlurmJobLost", "message": message, "traceback": ""}
    return record


def record_lost_cells(
    cells: Iterable[tuple[str, str, int, dict]], log
) -> tuple[list[str], list[str]]:
    """After a run that failed on Slurm: each cell (experiment, id, repeat, labelled knobs) whose
    job did not complete gets a lost.json, and its result.json goes (Snakemake, which has no record
    of it, would never rerun it).

    Cells are matched to their jobs by the job ids in the run's log (submitted_jobs), never by the
    job comment. Returns the paths the summary reads (every result.json plus the lost.json) and one
    line per lost cell.
    """
    from .job import result_path

    jobs = submitted_jobs(log)
    states = job_states(run_id(log) or "") if jobs else {}
    gave_up = given_up(log)
    paths, lost = [], []
    for experiment, cell, repeat, labelled in cells:
        result = result_path(experiment, cell, repeat)
        folder = os.path.dirname(result)
        job_id = jobs.get(jobs_key(experiment, cell, repeat))
        state, started = states.get(job_id, (None, None))
        # cancelled by the run while pending: it never left PENDING, and never started
        if job_id in gave_up:
            state, started = "PENDING", None
        # None: not submitted by this run, or unknown
        if os.path.exists(result) and state in (None, FINISHED):
            paths.append(result)
            continue
        job = (job_id, state or "in a state neither sacct nor squeue reports") if job_id else None
        record = lost_result(result, labelled, job, started, gave_up.get(job_id))
        os.makedirs(folder, exist_ok=True)
        with open(f"{folder}/lost.json", "w") as f:
            json.dump(record, f, indent=1)
        if os.path.exists(result):
            os.remove(result)
        paths.append(f"{folder}/lost.json")
        lost.append(f"{experiment}/{cell}/rep{repeat} ({record['error']['message'].split(';')[0]})")
    return paths, lost
