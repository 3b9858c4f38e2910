"""What the workflow does on a Slurm cluster beyond the executor plugin: docs/reliability-slurm.md.

* Before any job: refuse a cell that needs more CPUs per node than the
  partition's nodes have (sbatch would reject it and the run end without a report).
* Three workarounds for snakemake-executor-plugin-slurm 2.8 (docs/upstream/):
  a job cancelled with scancel ("CANCELLED by 0" in sacct) counts as failed
  instead of running forever; a failed node list of "None assigned" is never
  passed to sbatch --exclude; the account guess, whose sacct call cannot work,
  is skipped quietly (sbatch then charges the user's default account).
* After a run in which jobs were lost (NODE_FAIL, cancelled, refused by
  sbatch): each lost cell gets a lost.json saying its Slurm state, and the
  summary and report are made from every result plus those, so the report
  lists them. A lost cell has no result.json, so the next run runs it again.

No torch: the Snakefile imports this module.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable

from . import resources


def on_slurm(workflow) -> bool:
    """Whether this Snakemake process submits jobs to Slurm (not a job, not a dry run)."""
    plugin = workflow.executor_plugin
    return plugin is not None and plugin.name == "slurm" and not workflow.dryrun


def bench_resource(workflow, name: str):
    """A resource the command line or profile gives the bench rule (set-resources, then default-resources)."""
    settings = workflow.resource_settings
    for mapping in ((settings.overwrite_resources or {}).get("bench") or {}, settings.default_resources or {}):
        value = mapping.get(name) if hasattr(mapping, "get") else None
        value = getattr(value, "raw", value)  # as given: "debug" or "'debug'"; not evaluated outside a job
        if value not in (None, ""):
            return str(value).strip("'\"")
    return None


def node_cpus(partition: str | None) -> tuple[str, int]:
    """The partition (given, or the cluster's default) and the most CPUs one of its nodes has, from sinfo."""
    lines = subprocess.run(["sinfo", "-h", "-o", "%P %c"], capture_output=True, text=True, check=True, timeout=60)
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
        raise ValueError(f"bad config: slurm_partition: '{partition}' is not a partition; allowed: {known}")
    return partition, cpus[partition]


def cells_fit_error(cells: Iterable[tuple[str, str, dict]], partition: str, cpus: int) -> str | None:
    """One line for the first cell (experiment, id, knobs) that needs more CPUs per node than there are."""
    for experiment, cell, knobs in cells:
        error = resources.node_fit_error(knobs, cpus, partition)
        if error:
            return f"bad config: experiments.{experiment}: cell {cell} {error}"
    return None


# Plugin workarounds ---------------------------------------------------------


def _state(status: str) -> str:
    """sacct's "CANCELLED by 0" is the state CANCELLED; the plugin compares the whole text."""
    return status.split(" by ")[0]


def patch_plugin() -> None:
    """Apply the three workarounds to the loaded plugin (docs/upstream/ has the reports to send)."""
    import snakemake_executor_plugin_slurm as plugin

    query = plugin.query_job_status
    if not getattr(query, "feedbench", False):

        async def query_job_status(command, logger):
            states, duration = await query(command, logger)
            return ({job: _state(status) for job, status in states.items()} if states is not None else None), duration

        query_job_status.feedbench = True
        plugin.query_job_status = query_job_status

    submit = plugin.get_submit_command
    if not getattr(submit, "feedbench", False):

        def get_submit_command(job, params, settings=None, failed_nodes=None, array_job=False):
            nodes = {node for node in failed_nodes or () if node and " " not in node}  # never "None assigned"
            return submit(job, params, settings=settings, failed_nodes=nodes, array_job=array_job)

        get_submit_command.feedbench = True
        plugin.get_submit_command = get_submit_command

    plugin.get_account = lambda logger: None


# Lost cells -----------------------------------------------------------------


def run_id(logs) -> str | None:
    """The plugin's run id (every job's name) from Snakemake's log of the run (one path, or a list of them)."""
    found = []
    for path in [logs] if isinstance(logs, (str, os.PathLike)) else list(logs or []):
        try:
            with open(path, errors="replace") as f:
                found += re.findall(r"SLURM run ID: (\S+)", f.read())
        except OSError:
            continue
    return found[-1] if found else None


def job_states(run: str) -> dict[str, tuple[str, str]]:
    """comment -> (job id, state) of the run's jobs, the last job of each comment; sacct, else squeue."""
    if not run:
        return {}
    commands = [
        ["sacct", "-X", "-P", "-n", "--starttime", "now-7days", "--name", run, "-o", "JobIDRaw,State,Comment"],
        ["squeue", "-h", "--states=all", "--name", run, "-o", "%i|%T|%k"],
    ]
    for command in commands:
        if shutil.which(command[0]) is None:
            continue
        out = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            continue
        states = {}
        for line in sorted(out.stdout.splitlines(), key=lambda line: int(line.split("|")[0] or 0)):
            job, state, comment = line.split("|", 2)
            states[comment] = (job, _state(state))
        return states
    return {}


def comment(experiment: str, cell: str, repeat: int) -> str:
    """The job comment the plugin gives a bench job: the rule and its wildcards."""
    return f"rule_bench_wildcards_{experiment}_{cell}_{repeat}"


def lost_result(result_path: str, labelled: dict, job: tuple[str, str] | None) -> dict:
    """The record of a lost cell: the harness's own result when it wrote one (kept by keep-incomplete), else empty."""
    from .result import failed_result, now  # result.py loads jsonschema: only when cells were lost

    how = f"Slurm job {job[0]} ended {job[1]}" if job else "no Slurm job ran (sbatch refused it, or the run stopped)"
    message = f"{how}; the cell is lost and the next run runs it again"
    try:
        with open(result_path) as f:
            result = json.load(f)
    except (OSError, ValueError):
        result = dict(failed_result(labelled, labelled), finished_at=now())
        result["error"] = {"type": "SlurmJobLost", "message": message, "traceback": ""}
        return result
    result["status"] = "failed"
    error = result.get("error") or {}
    result["error"] = dict(
        error,
        type=error.get("type") or "SlurmJobLost",
        message=f"{message}; the harness said: {error.get('message', 'nothing')}",
    )
    return result
