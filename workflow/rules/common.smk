# The rules' input functions and the glue they share: the config's cells, the paths of results,
# plots and report. What decides something lives in the feedbench package (the Snakefile put it on
# sys.path and PYTHONPATH).

import functools
import json
import os
import shlex
import sys

from snakemake.exceptions import WorkflowError

from feedbench.core import preflight as feedbench_preflight
from feedbench.core import resources as cell_resources
from feedbench.core import search as feedbench_search
from feedbench.core.attempts import keep_earlier
from feedbench.core import shm as feedbench_shm
from feedbench.plan import slurm as feedbench_slurm
from feedbench.plan import twins as feedbench_twins
from feedbench.core.ceilings import CEILING_EXPERIMENTS, ceiling_map, training_cells
from feedbench.plan.config import (
    ConfigError,
    config_dir,
    config_hash,
    one_line,
    stop,
    typed_overrides,
)
from feedbench.core.cpu_speed import is_speed_file
from feedbench.plan.failures import failed_cells_message
from feedbench.plan.job import CELL_DIR, CELL_LOG, PYTHON_VARIABLE, attempt, job_python, result_path
from feedbench.plan.matrix import (
    baseline,
    harness_fingerprint,
    planned_cells,
    search_ceilings,
    search_dry_run_line,
    search_levels,
)
from feedbench.core.plugins import content_hash
from feedbench.core.command import fingerprint as command_fingerprint
from feedbench.core.references import reference_tables
from feedbench.core.target import MEASURED_EXPERIMENT, measured_cells, measured_resources
from feedbench.core.threads import launch_args

IMAGES_DIR = "results/data/images"
# The shell rules' Python, "$FEEDBENCH_PYTHON": this workflow's own, or the rule's conda env's
# (feedbench.plan.job.job_python); set as PYTHONPATH is in the Snakefile, and inherited by every
# job.
os.environ.update({PYTHON_VARIABLE: job_python(workflow.deployment_settings.deployment_method)})
# The thread variables (OMP_NUM_THREADS, ...) as the user launched the workflow, before Snakemake
# sets every job's to its threads: the bench job hands them back to the harness, so that a cell's
# trainer gets the threads the user's own launch would (feedbench.core.threads). Quoted for the
# shell, braces doubled for Snakemake's format.
LAUNCH_ENV = "".join(
    f" {shlex.quote(arg)}".replace("{", "{{").replace("}", "}}") for arg in launch_args(os.environ)
)


wildcard_constraints:
    experiment=r"[A-Za-z0-9][A-Za-z0-9_-]*",
    cell=r"[^/]+",
    repeat=r"\d+",


CONFIG_FILES = workflow.overwrite_configfiles or [
    os.path.join(workflow.basedir, "config", "config.yaml")
]
# the folder of the config that names the experiments: the report shows paths under it relative to
# it, as the config writes them (python_path: [src])
CONFIG_DIR = config_dir("experiments", CONFIG_FILES)


def validated_config(config):
    """Every cell of the config, checked (feedbench.plan.matrix.planned_cells); one line on
    error."""
    configfiles = CONFIG_FILES
    try:
        typed_overrides(config, workflow.config_settings.config)
        cells = planned_cells(
            config, os.path.join(workflow.basedir, "config", "schema.yaml"), configfiles, IMAGES_DIR
        )
    except ConfigError as error:
        stop(one_line(error))
    return {(cell.experiment, cell.id): cell for cell in cells}


@functools.cache
def user_code(paths):
    """Fingerprint of the user's python_path folders: in the params of the cells that import from
    them."""
    return content_hash(list(paths))


CELLS = validated_config(config)
REPEATS = config["defaults"]["repeats"]
HARNESS = harness_fingerprint(os.path.join(PACKAGE_ROOT, "feedbench"))
# Experiments with `search: num_workers`: their training cells are chosen by checkpoint search
# (rules/search.smk). A searched experiment of loader cells runs every level
# (feedbench.core.search.checkpointed): no checkpoint.
SEARCHED = {
    name: feedbench_search.axis_of(spec["search"])
    for name, spec in config["experiments"].items()
    if spec.get("search") and feedbench_search.checkpointed(spec, config["defaults"])
}

# Cells this machine runs alike (a pin_memory twin, without CUDA or with `device: cpu`): each job of
# one waits for the other's and takes its result (feedbench.plan.twins).
TWINS = feedbench_twins.twins(
    CELLS, feedbench_twins.cuda_here(), skip=[*SEARCHED, MEASURED_EXPERIMENT]
)


def repeats_of(experiment, cell):
    return [result_path(experiment, cell, repeat) for repeat in range(1, REPEATS + 1)]


def stopped_records(experiment, cell=None):
    """The stopped records of an experiment's cells (or of one), read in place of their results when
    the experiment's preflight stopped it (feedbench.core.preflight.STOPPED)."""
    cells = [c for (e, c) in CELLS if e == experiment and cell in (None, c)]
    return [
        feedbench_preflight.STOPPED.format(experiment=experiment, cell=c, repeat=r)
        for c in cells
        for r in range(1, REPEATS + 1)
    ]


# Experiments whose cells run the user's code -> the first cell of each distinct combination of it:
# each such experiment has a preflight (rules/preflight.smk, feedbench.core.preflight). Those not
# searched are GATED: the summary reads their cells once their preflight passed, else each cell's
# stopped record.
PREFLIGHTS = feedbench_preflight.combinations(CELLS.values())
GATED = [name for name in PREFLIGHTS if name not in SEARCHED]


@functools.cache
def ceiling_gates():
    """Of each ceiling experiment with a preflight, the cells that bound only cells of gated
    experiments -> those experiments (feedbench.core.preflight.gates): its preflight waits for
    theirs, and a cell all of whose experiments their preflight stopped is stopped with them
    (orphaned_cells). Made when first asked, not at every parse: it walks the ceiling map."""
    if not any(name in CEILING_EXPERIMENTS.values() for name in PREFLIGHTS):
        return {}
    return feedbench_preflight.gates(CELLS.values(), GATED)


# Every cell the matrix plans, less those of searched experiments (which wait for their checkpoint)
# and those of gated experiments (which wait for their preflight: rules/preflight.smk,
# gated_results).
PLANNED_RESULTS = [
    path for (e, c) in CELLS if e not in SEARCHED and e not in GATED for path in repeats_of(e, c)
]
SEARCH_PLANS = [f"results/search/{name}.json" for name in SEARCHED]


def result_files(wildcards):
    """The results the summary and the report read: every planned cell, and of each searched
    experiment the cells its checkpoint chose (so Snakemake re-evaluates the DAG once the ceilings
    are measured)."""
    paths = list(PLANNED_RESULTS)
    for name in SEARCHED:
        plan = feedbench_search.read(checkpoints.search.get(experiment=name).output.plan)
        paths += [path for cell in plan["run"] for path in repeats_of(name, cell)]
    return paths


def stopped_experiments():
    """The experiments whose preflight failed, as their records say now."""
    return {
        name
        for name in PREFLIGHTS
        if feedbench_preflight.failed(feedbench_preflight.PREFLIGHT.format(experiment=name))
    }


def orphaned_cells(stopped):
    """(ceiling experiment, cell) -> the experiment whose stopped preflight stops it: a ceiling cell
    whose every experiment (ceiling_gates) is among `stopped` (stopped_experiments)."""
    return {
        (name, cell): source
        for name, gated in ceiling_gates().items()
        if name not in stopped
        for cell, source in feedbench_preflight.orphaned(gated, stopped).items()
    }


def chosen_cells():
    """(experiment, cell) of every cell this run measures as far as is known now: a searched
    experiment's cells once its checkpoint has written its choice, none before; none of an
    experiment its preflight stopped, nor a ceiling cell of such experiments alone."""
    chosen = set()
    for name in SEARCHED:
        if os.path.exists(f"results/search/{name}.json"):
            chosen |= {
                (name, cell) for cell in feedbench_search.read(f"results/search/{name}.json")["run"]
            }
    stopped = stopped_experiments()
    orphans = orphaned_cells(stopped)
    return [
        key
        for key in CELLS
        if (key[0] not in SEARCHED or key in chosen)
        and key[0] not in stopped
        and key not in orphans
    ]


# Rule aggregate's input: a plain list unless a checkpoint chooses cells. Snakemake takes a list's
# paths as they are, but checks and flags every path an input function returns, one by one: about
# 0.2 s of CPU at 10,000 cells.
RESULTS = result_files if SEARCHED else PLANNED_RESULTS
# The published files (rules aggregate, plot, report); after lost Slurm jobs, report_lost_cells
# makes them too.
SUMMARY = "results/summary.csv"
# Every result read once as a typed record, in the summary's order (feedbench.core.records), by the
# aggregate job; the report and the run's end (failed_cells) read these, not the result files.
RECORDS = "results/records.json"
CEILING_MAP = (
    # which cells bound each training cell: the summary's join (feedbench.core.ceilings)
    "results/ceilings.json"
)
REPORT = "results/report/index.html"
# the report's verdicts as text: the run's end prints them (print_verdict)
VERDICT = "results/report/verdict.txt"
# The estimates for the config's target (rule target), read by the report's section "On <target>";
# none without one.
TARGET_ESTIMATES = "results/target.json"
TARGET_FILES = [TARGET_ESTIMATES] if config.get("target") else []
# With `target: {compute: measured}`: each training cell (`<experiment>/<cell>`) -> its compute
# ceiling measured on the target's GPU (feedbench.core.target.measured_cells), whose results rule
# target reads.
MEASURED = {
    key: (c.experiment, c.id) for key, c in measured_cells(config, list(CELLS.values())).items()
}
MEASURED_RESULTS = sorted({path for cell in MEASURED.values() for path in repeats_of(*cell)})
# A target's cpu_speed measured there: its file (made absolute by planned_cells) is rule target's
# input, and rule target runs the same reference cell here,
# alone: threads beyond --cores are capped at it, so no local job shares the CPU with the
# measurement (feedbench.core.cpu_speed).
TARGET_SPEED_FILES = (
    [config["target"]["cpu_speed"]]
    if config.get("target") and is_speed_file(config["target"]["cpu_speed"])
    else []
)
TARGET_THREADS = 2**16 if TARGET_SPEED_FILES else 1
PLOT_FILES = {
    name: f"results/plots/{name}.svg"
    for name, spec in config["experiments"].items()
    if spec.get("plot")
}
PLOTS = list(PLOT_FILES.values())
# Published tables shown beside the study views: report/references/<name>.csv (README there).
REFERENCES_DIR = os.path.join(workflow.basedir, "report", "references")


try:
    REFERENCES = reference_tables(config["experiments"], REFERENCES_DIR)
except ValueError as error:
    stop(str(error))

# Rule report's inputs beside the summary and the plots, by the names
# feedbench.analysis.report.INPUTS reads them under: a new one is a line here and one there.
REPORT_INPUTS = {
    "references": REFERENCES,
    "searches": SEARCH_PLANS,
    # the planner's map: ceiling cells fold under the experiments they serve
    "ceilings": CEILING_MAP,
    "target": TARGET_FILES,
}


def search_inputs(wildcards):
    """What checkpoint search reads: every repeat of the ceilings of every cell of the
    experiment."""
    sources = search_ceilings(
        list(CELLS.values()), wildcards.experiment, SEARCHED[wildcards.experiment]
    )
    return [path for (e, c) in sources for path in repeats_of(e, c)]


def search_groups_json(wildcards):
    """The checkpoint's params (feedbench.plan.matrix.search_levels), as JSON."""
    experiment = wildcards.experiment
    return json.dumps(
        search_levels(list(CELLS.values()), experiment, SEARCHED[experiment], repeats_of),
        sort_keys=True,
    )


def cell_of(wildcards):
    key = (wildcards.experiment, wildcards.cell)
    if key not in CELLS:
        raise WorkflowError(
            f"no cell '{wildcards.cell}' in experiment '{wildcards.experiment}' of the config"
        )
    return CELLS[key]


def cell_knobs(wildcards):
    """The knobs of the job as one JSON text (also valid YAML): the bench rule's `params.cell`.
    Non-ASCII as itself, not as \\u escapes, which PyYAML would read back as lone surrogates (an
    emoji in a data_dir, say)."""
    path = result_path(wildcards.experiment, wildcards.cell, wildcards.repeat)
    knobs = dict(
        cell_of(wildcards).labelled(int(wildcards.repeat)),
        attempt=attempt(path, config["retry_failed"]),
    )
    if knobs.get("python_path"):  # a change to the user's code reruns the cells that use it
        knobs["code"] = user_code(tuple(knobs["python_path"]))
    if knobs.get("command"):  # and a change to a command's script
        knobs["code"] = command_fingerprint(knobs)
    twin = TWINS.get((wildcards.experiment, wildcards.cell))
    if twin:
        knobs[feedbench_twins.TWIN_LABEL] = twin
    return json.dumps(knobs, sort_keys=True, ensure_ascii=False)


def images_read(knobs):
    """The generated image folder for a cell that reads it, else nothing: the bench rule's input
    `images`."""
    return IMAGES_DIR if knobs.get("data_dir") == IMAGES_DIR else []


def bench_inputs():
    """Rule bench's inputs: `images` when a cell of the run reads the generated images, `preflight`
    when a cell's experiment has one (rules/preflight.smk), else none at all (an empty input costs
    0.3 s of CPU at 10,000 cells: docs/performance.md, "Workflow DAG")."""
    images = per_cell(images_read)
    inputs = {} if images == [] else {"images": images}
    if PREFLIGHTS:
        inputs["preflight"] = preflight_input()
    if TWINS:
        inputs["twin"] = twin_result
    return inputs


def twin_result(wildcards):
    """The result of the cell measured for this one (TWINS), else nothing: rule bench's input
    `twin`."""
    twin = TWINS.get((wildcards.experiment, wildcards.cell))
    return [] if twin is None else result_path(wildcards.experiment, twin, wildcards.repeat)


def preflight_input():
    """The record of the cell's experiment's preflight: a constant pattern when every experiment has
    one, else a function of the job. ancient(): a preflight run again (its attempt, its code) never
    reruns a cell by its date."""
    if all(experiment in PREFLIGHTS for experiment, _ in CELLS):
        return ancient(feedbench_preflight.PREFLIGHT)

    def preflight_of(wildcards):
        if wildcards.experiment not in PREFLIGHTS:
            return []
        return ancient(feedbench_preflight.PREFLIGHT.format(experiment=wildcards.experiment))

    return preflight_of


# Resources from the cell (docs/workflow.md: "Resources of a cell"): feedbench.core.resources, which
# the launcher uses too. Knobs a cell does not set take the harness's defaults.
def per_cell(of_knobs):
    """An input, the threads or a resource of the bench rule: a constant when every cell has the
    same, else a function of the job. Snakemake calls a function for every job, a constant never:
    seconds at 10,000 cells (docs/performance.md, "Workflow DAG"); runs that mix in multi-process
    cells pay for it."""
    values = [of_knobs(cell.knobs) for cell in CELLS.values()]
    if values and all(value == values[0] for value in values):
        return values[0]

    def of_the_job(wildcards):
        return of_knobs(cell_of(wildcards).knobs)

    of_the_job.__name__ = f"cell_{of_knobs.__name__}"
    return of_the_job


def cell_mem_mb(wildcards, threads):
    """Per node, from the threads Snakemake gives the job (capped at --cores): always a function of
    the job."""
    return cell_resources.mem_mb(cell_of(wildcards).knobs, threads)


def experiment_spec(wildcards):
    return config["experiments"][wildcards.experiment]


def report_lost_cells(log):
    """After lost Slurm jobs (the Snakefile's onerror; docs/reliability-slurm.md): a lost.json for
    each lost cell (feedbench.plan.slurm.record_lost_cells), then the summary, plots and report from
    everything there is."""
    cells = (
        (experiment, cell_id, repeat, CELLS[(experiment, cell_id)].labelled(repeat))
        for experiment, cell_id in chosen_cells()
        for repeat in range(1, REPEATS + 1)
    )
    paths, lost = feedbench_slurm.record_lost_cells(cells, log)
    if not lost:
        return
    stopped = stopped_experiments()
    paths += [
        path
        for name, cell in [*((name, None) for name in stopped), *orphaned_cells(stopped)]
        for path in stopped_records(name, cell)
        if os.path.exists(path)
    ]
    from feedbench.analysis.publish import publish

    # Dated 1970, older than every result: the next run makes them again, and runs the lost cells
    # they need (Snakemake does not rerun a missing input of an output that is up to date).
    links = ceiling_map(list(CELLS.values()))
    target = [path for path in TARGET_FILES if os.path.exists(path)]
    published = publish(
        paths,
        PLOT_FILES,
        dict(config),
        config_hash(config),
        SUMMARY,
        REPORT,
        references=REFERENCES,
        ceilings=links,
        target=target,
    )
    for path in published:
        os.utime(path, (0, 0))
    print(
        f"feedbench: {len(lost)} cell(s) lost on Slurm, listed in {REPORT}; the next run runs them"
        f" again: {'; '.join(lost)}",
        file=sys.stderr,
    )


def keep_earlier_attempts():
    """Before the cell jobs run (the Snakefile's onstart): the earlier attempt of each cell this run
    runs moves to its attempts/ folder, its result.json and log included, which Snakemake deletes
    before the job starts (feedbench.core.attempts; docs/reliability-slurm.md, "Every attempt
    kept"). Not with --touch, which runs nothing."""
    if workflow.touch:
        return
    for job in workflow.dag.needrun_jobs():
        if job.rule.name in feedbench_slurm.BENCH_RULES:
            labels = {name: job.wildcards[name] for name in ("experiment", "cell", "repeat")}
            keep_earlier(CELL_DIR.format(**labels), CELL_LOG.format(**labels))


def end_run(message):
    """End the run from one of its handlers (onstart, onsuccess) with `message` alone on stderr and
    exit status 1 (feedbench.plan.config.stop): a WorkflowError raised there prints the Snakefile's
    path and line and a traceback line around the message."""
    stop(message)


def print_verdict():
    """The run's end (onsuccess), where this run made the report: its verdicts in the terminal,
    three lines per experiment, so a machine with no browser reads them too."""
    if any(job.rule.name == "report" for job in workflow.dag.jobs) and os.path.exists(VERDICT):
        with open(VERDICT) as f:
            print(f"feedbench: the verdict ({REPORT}):\n{f.read()}", end="")


def failed_cells(succeeded=True):
    """The run's end when a cell failed or an experiment was stopped by its preflight
    (feedbench.plan.failures), else None: every cell job the run's targets need, whether this run
    ran it or an earlier one did, and every preflight they need; a target short of the cells answers
    for fewer or none. The report is named where the run succeeded and made it."""
    dag = workflow.dag
    jobs = list(dag.jobs)
    cells = (
        (job.wildcards.experiment, job.wildcards.cell, int(job.wildcards.repeat), dag.finished(job))
        for job in jobs
        if job.rule.name in feedbench_slurm.BENCH_RULES
    )
    made = succeeded and any(job.rule.name == "report" for job in jobs)
    # The records, where this run's aggregate made them or found them up to date: every cell's
    # status and error without opening its result.json again.
    records = RECORDS if succeeded and any(job.rule.name == "aggregate" for job in jobs) else None
    preflights = sorted({job.wildcards.experiment for job in jobs if job.rule.name == "preflight"})
    lines = feedbench_preflight.stopped_lines(
        {e: feedbench_preflight.PREFLIGHT.format(experiment=e) for e in preflights}
    )
    return failed_cells_message(sorted(cells), REPORT if made else None, lines, records)


# The preflight's input functions and params (rules/preflight.smk, feedbench.core.preflight).
def preflight_cells(wildcards):
    """The first cell of each combination of the experiment, labelled as its bench job's, as one
    JSON text."""
    return json.dumps(
        [cell.labelled(1) for cell in PREFLIGHTS[wildcards.experiment]],
        sort_keys=True,
        ensure_ascii=False,
    )


@functools.cache
def preflight_waits(experiment):
    """A ceiling experiment's: the first cell of each combination -> the preflight records of the
    experiments it bounds (feedbench.core.preflight.waits_for); none for another experiment."""
    gated = ceiling_gates().get(experiment)
    if not gated:
        return {}
    return {
        first: [feedbench_preflight.PREFLIGHT.format(experiment=name) for name in served]
        for first, served in feedbench_preflight.waits_for(
            experiment, CELLS.values(), gated
        ).items()
    }


def preflight_after(wildcards):
    """The preflight records a ceiling experiment's preflight waits for (preflight_waits): it runs
    once those of the experiments it bounds have."""
    return sorted(
        {path for paths in preflight_waits(wildcards.experiment).values() for path in paths}
    )


def preflight_after_json(wildcards):
    return json.dumps(preflight_waits(wildcards.experiment), sort_keys=True)


def preflight_images(wildcards):
    """The generated image folder when a cell the preflight builds reads it (as rule bench's input
    `images`)."""
    return next(
        (IMAGES_DIR for cell in PREFLIGHTS[wildcards.experiment] if images_read(cell.knobs)), []
    )


def preflight_code(wildcards):
    """Fingerprint of the experiment's python_path folders, or of its commands' scripts: a change
    to the user's code runs its preflight again."""
    firsts = PREFLIGHTS[wildcards.experiment]
    paths = tuple(firsts[0].knobs.get("python_path") or ())
    scripts = [command_fingerprint(cell.knobs) for cell in firsts if cell.knobs.get("command")]
    return "+".join(filter(None, [user_code(paths) if paths else None, *scripts])) or None


def preflight_attempt(wildcards):
    """A new attempt after a failed preflight (retry_failed), else the one its record ran as."""
    path = feedbench_preflight.PREFLIGHT.format(experiment=wildcards.experiment)
    return feedbench_preflight.attempt(path, config["retry_failed"])


def preflight_resource(name):
    def of_the_job(wildcards):
        return feedbench_preflight.resources(PREFLIGHTS[wildcards.experiment])[name]

    of_the_job.__name__ = f"preflight_{name}"
    return of_the_job


def gated_results(experiment):
    """The summary's inputs of a gated experiment, as an input function of their own: its cells'
    results once its preflight passed, else its preflight's record (stopped_cells). One function per
    experiment, each an input of rule aggregate by
    itself: Snakemake evaluates each input on its own, so every experiment's preflight is found and
    run at once, and experiments without user code are planned meanwhile."""

    def results(wildcards):
        record = checkpoints.preflight.get(experiment=experiment).output.record
        if feedbench_preflight.failed(record):
            return [record]
        # a ceiling cell whose experiments were all stopped: their record, read as its stopped one
        orphans = orphaned_cells(stopped_experiments()) if experiment in ceiling_gates() else {}
        paths = [
            path
            for (e, c) in CELLS
            if e == experiment
            for path in (
                [feedbench_preflight.PREFLIGHT.format(experiment=orphans[(e, c)])]
                if (e, c) in orphans
                else repeats_of(e, c)
            )
        ]
        return list(dict.fromkeys(paths))

    results.__name__ = f"results_of_{experiment.replace('-', '_')}"
    return results


# Rule aggregate's inputs besides RESULTS: one per gated experiment.
GATED_RESULTS = {f"gated_{i}": gated_results(name) for i, name in enumerate(GATED)}


def stopped_cells(wildcards):
    """Rule aggregate's params: of each experiment its preflight stopped, its record -> (each cell's
    stopped record, its labelled knobs), which the summary writes and reads in place of results
    (feedbench.core.preflight)."""
    stopped = stopped_experiments()
    found = {
        feedbench_preflight.PREFLIGHT.format(experiment=name): [
            (path, CELLS[(name, cell)].labelled(repeat))
            for (e, cell) in CELLS
            if e == name
            for repeat, path in enumerate(stopped_records(name, cell), start=1)
        ]
        for name in stopped
        if name in GATED
    }
    # a ceiling cell of stopped experiments alone: stopped by the first one's record
    for (name, cell), source in orphaned_cells(stopped).items():
        found.setdefault(feedbench_preflight.PREFLIGHT.format(experiment=source), []).extend(
            (path, CELLS[(name, cell)].labelled(repeat))
            for repeat, path in enumerate(stopped_records(name, cell), start=1)
        )
    return found
