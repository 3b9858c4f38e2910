# feedbench: is my GPU starved by its input pipeline, and which knobs fix it?
# Layout and data flow: README.md. The config is validated against
# config/schema.yaml and expanded into cells before any job starts.

import gc
import os
import sys

from snakemake.utils import min_version

min_version("9.0")

# The workflow runs the feedbench package that sits beside this Snakefile
# (workflow/feedbench), here and in every job (PYTHONPATH is inherited), so a
# copy of the workflow runs its own harness. It stays an environment variable:
# the rules' conda envs do not install feedbench, and shell jobs, script jobs
# and torchrun's ranks all inherit it; a Slurm job runs this Snakefile again and
# sets it there. `snakemake --lint` asks for an `envvars:` directive for every
# os.environ[...] it sees, which is for variables the user must provide; this
# one the workflow sets itself, hence update() rather than an envvars the user
# would have to satisfy.
PACKAGE_ROOT = os.path.join(workflow.basedir, "workflow")
if PACKAGE_ROOT not in sys.path:
    sys.path.insert(0, PACKAGE_ROOT)
if PACKAGE_ROOT not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ.update(
        PYTHONPATH=os.pathsep.join(p for p in (PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)
    )

from feedbench.plan.config import ConfigError, one_line, read_config_file, stop
from feedbench.plan import slurm as feedbench_slurm

# Before Snakemake builds its scheduler, here and in every Slurm job's Snakemake: its SIGTERM
# handler without the deadlock that once left a cancelled job's Snakemake running for 27 min; for a
# cluster's executor, the status checks' sleep that ends with the run and wakes when a job has
# written its outputs, in place before its first sleep begins (feedbench.plan.slurm;
# docs/reliability-slurm.md).
feedbench_slurm.sigterm_without_deadlock()
feedbench_slurm.check_soon_and_end_at_once()

# The config files, read as plain data before Snakemake's `configfile:` reads
# them: a syntax error names its line, YTE templates (code) are refused, a YAML
# alias bomb is stopped. Files given with --configfile were read by Snakemake
# before this line could run (docs/knobs.md: "Configs are code?").
try:
    for path in workflow.overwrite_configfiles or ["config/config.yaml"]:
        read_config_file(str(path), read_by_snakemake=bool(workflow.overwrite_configfiles))
except ConfigError as error:
    stop(one_line(error))


# The default matrix, unless configfiles are given (`--configfile
# config/presets/nmt.yaml`): then they alone are the config, so a preset never
# inherits the default experiments. `--config key=value` merges over whichever
# it is. Jobs get the same configfiles, so they see the same config.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/preflight.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/search.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        REPORT,


# Light rules run in this process, not as cluster jobs: on Slurm each job costs
# a status cycle (tens of seconds) before the next one starts.
localrules:
    all,
    aggregate,
    plot,
    report,
    target,


# On Slurm (profiles/slurm): refuse cells wider than a node before any job, work around the executor
# plugin's faults, say why a job waits (and cancel one stuck past slurm.pending_timeout), stop on
# SIGTERM as on Ctrl-C, and after lost jobs still make the report (feedbench.plan.slurm;
# docs/reliability-slurm.md). Run here: refuse cells whose batches in flight do not fit /dev/shm
# (feedbench.core.shm). Then each cell run again keeps its earlier attempt in its attempts/ folder
# (feedbench.core.attempts).
onstart:
    if feedbench_slurm.on_slurm(workflow):
        feedbench_slurm.patch_plugin(
            never_requeued=bool(workflow.executor_settings.no_requeue),
            pending_timeout=config["slurm"].get("pending_timeout"),
        )
        feedbench_slurm.stop_on_sigterm()
        error = feedbench_slurm.check_cells_fit(
            workflow, ((e, c, cell.knobs) for (e, c), cell in CELLS.items())
        )
        if error:
            end_run(error)
    elif feedbench_shm.runs_here(workflow):
        error = feedbench_shm.plan_error((e, c, cell.knobs) for (e, c), cell in CELLS.items())
        if error:
            end_run(error)
    if config.get("target"):
        # A cell that plainly cannot fit the target's GPU memory, counted on the meta device (torch:
        # imported here, in this process alone, never in a job's parse;
        # feedbench.harness.flops.memory_error).
        from feedbench.harness.flops import memory_error

        error = memory_error(config["target"], training_cells(list(CELLS.values())))
        if error:
            end_run(error)
    keep_earlier_attempts()


# A bench job succeeds even when its cell fails, so that the matrix goes on and the report lists the
# cell. The run's end then names every failed cell of its targets in one line each and exits 1, as
# after lost Slurm jobs (end_run; README, "Exit code"). Snakemake calls no handler on a dry run,
# with --no-hooks, or when there is nothing to do.
onsuccess:
    print_verdict()
    message = failed_cells()
    if message:
        end_run(message)


onerror:
    if feedbench_slurm.on_slurm(workflow):
        report_lost_cells(log)
    message = failed_cells(succeeded=False)
    if message:
        print(message, file=sys.stderr)


# Last, once the config, the matrix (CELLS: every cell, checked) and the rules are built: they live
# until the end of the run, so they leave the garbage collector's generations for good (gc.freeze).
# Else every collection while Snakemake plans the jobs walks them again: half a second of CPU at
# 10,000 cells (docs/performance.md, "Workflow DAG"). Objects made later, Snakemake's jobs included,
# are collected as before. (A collection here first would find no garbage: the parse leaves none.)
gc.freeze()
