# Config validation, matrix expansion and the helpers the rules call.
# Everything that decides something lives here, in named functions: the rules
# only wire files together.

# The Snakefile has put the feedbench package beside it (PACKAGE_ROOT) on sys.path and PYTHONPATH.

import copy
import functools
import hashlib
import json
import os
import subprocess
import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import update_config

from feedbench import resources as cell_resources
from feedbench import search as feedbench_search
from feedbench import slurm as feedbench_slurm
from feedbench.config import ConfigError, count_values, one_line, read_config_file, validate_config
from feedbench.job import CELL_DIR, CELL_LOG
from feedbench.matrix import build_cells, ceiling_sources, harness_fingerprint, search_groups
from feedbench.plugins import content_hash
from feedbench.result import UnusableResult, read_result

IMAGES_DIR = "results/data/images"


wildcard_constraints:
    experiment=r"[A-Za-z0-9][A-Za-z0-9_-]*",
    cell=r"[^/]+",
    repeat=r"\d+",


def sized(config):
    """`size: small` deep-merges the config's `small` fragment over it (dicts merge, lists and scalars replace).

    A preset runs at its study's size by default; `--config size=small` runs the
    same experiments small enough for a CPU in minutes. The merge comes before
    validation, so the small config is checked like any other.
    """
    size = config.get("size", "full")
    if size == "small" and isinstance(config.get("small"), dict):
        update_config(config, copy.deepcopy(config["small"]))
    return config


def validated_config(config):
    """Bound the config's size, merge `small` (sized), fill defaults from config/schema.yaml and check
    every cell (feedbench.matrix.PlannedCell, with the harness's parsed cell); one line on error."""
    try:
        count_values(config)
        validate_config(sized(config), os.path.join(workflow.basedir, "config", "schema.yaml"))
        config["python_path"] = [
            os.path.normpath(os.path.join(config_dir("python_path"), p)) for p in config["python_path"]
        ]
        cells = build_cells(config, IMAGES_DIR)
    except ConfigError as error:
        raise WorkflowError(one_line(error)) from None
    return {(cell.experiment, cell.id): cell for cell in cells}


def config_dir(key):
    """The folder of the last config file that sets `key`, whose paths are relative to it; else the working directory."""
    for path in reversed(workflow.overwrite_configfiles or [os.path.join(workflow.basedir, "config", "config.yaml")]):
        try:
            if key in read_config_file(str(path)):
                return os.path.dirname(os.path.abspath(str(path)))
        except ConfigError:
            continue
    return os.getcwd()


@functools.cache
def user_code(paths):
    """Fingerprint of the user's python_path folders: in the params of the cells that import from them."""
    return content_hash(list(paths))


CELLS = validated_config(config)
REPEATS = config["defaults"]["repeats"]
HARNESS = harness_fingerprint(os.path.join(PACKAGE_ROOT, "feedbench"))
# Experiments with `search: num_workers`: their training cells are chosen by checkpoint search (rules/search.smk).
SEARCHED = {name: spec["search"] for name, spec in config["experiments"].items() if spec.get("search")}


def result_path(experiment, cell, repeat):
    """A bench job's result.json, in its folder as rule bench names it (feedbench.job.CELL_DIR)."""
    return f"{CELL_DIR.format(experiment=experiment, cell=cell, repeat=repeat)}/result.json"


def repeats_of(experiment, cell):
    return [result_path(experiment, cell, repeat) for repeat in range(1, REPEATS + 1)]


# Every cell the matrix plans, less those of searched experiments (which wait for their checkpoint).
PLANNED_RESULTS = [path for (e, c) in CELLS if e not in SEARCHED for path in repeats_of(e, c)]
SEARCH_PLANS = [f"results/search/{name}.json" for name in SEARCHED]


def result_files(wildcards):
    """The results the summary and the report read: every planned cell, and of each searched experiment the cells
    its checkpoint chose (so Snakemake re-evaluates the DAG once the ceilings are measured)."""
    paths = list(PLANNED_RESULTS)
    for name in SEARCHED:
        plan = feedbench_search.read(checkpoints.search.get(experiment=name).output.plan)
        paths += [path for cell in plan["run"] for path in repeats_of(name, cell)]
    return paths


def chosen_cells():
    """(experiment, cell) of every cell this run measures as far as is known now: a searched experiment's cells once
    its checkpoint has written its choice, none before."""
    chosen = set()
    for name in SEARCHED:
        if os.path.exists(f"results/search/{name}.json"):
            chosen |= {(name, cell) for cell in feedbench_search.read(f"results/search/{name}.json")["run"]}
    return [key for key in CELLS if key[0] not in SEARCHED or key in chosen]


# Rule aggregate's input: a plain list unless a checkpoint chooses cells. Snakemake takes a list's paths as they are,
# but checks and flags every path an input function returns, one by one: about 0.2 s of CPU at 10,000 cells.
RESULTS = result_files if SEARCHED else PLANNED_RESULTS
PLOTS = [f"results/plots/{name}.svg" for name, spec in config["experiments"].items() if spec.get("plot")]
# Published tables shown beside the study views: report/references/<name>.csv (README there).
REFERENCES_DIR = os.path.join(workflow.basedir, "report", "references")


def reference_tables(experiments):
    """The CSVs the report needs: each view's `reference` (default: the view's name, when that table exists)."""
    paths = set()
    for name, spec in experiments.items():
        if not spec.get("view"):
            continue
        # As feedbench.views.reference_name, not imported: pandas and matplotlib would slow every parse of the Snakefile.
        path = os.path.join(REFERENCES_DIR, f"{spec.get('reference') or spec['view']}.csv")
        if os.path.exists(path):
            paths.add(path)
        elif spec.get("reference"):
            known = ", ".join(sorted(f[:-4] for f in os.listdir(REFERENCES_DIR) if f.endswith(".csv")))
            raise WorkflowError(f"bad config: experiments.{name}.reference: no table {path}; allowed: {known}")
    return sorted(paths)


REFERENCES = reference_tables(config["experiments"])


def config_hash():
    """sha256 of the validated config (defaults filled in): names the run in the report."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def search_inputs(wildcards):
    """What checkpoint search reads: every repeat of the ceilings of every cell of the experiment."""
    cells = list(CELLS.values())
    sources = set()
    for group in search_groups(cells, wildcards.experiment, SEARCHED[wildcards.experiment]):
        for cell in group["cells"].values():
            sources |= {(c.experiment, c.id) for c in ceiling_sources(cell, cells).values() if c is not None}
    return [path for (e, c) in sorted(sources) for path in repeats_of(e, c)]


def search_groups_json(wildcards):
    """The checkpoint's params: per combination of the other knobs, each level's cell, knobs and ceiling results."""
    cells = list(CELLS.values())
    groups = []
    for group in search_groups(cells, wildcards.experiment, SEARCHED[wildcards.experiment]):
        levels = []
        for level, cell in group["cells"].items():
            sources = ceiling_sources(cell, cells)
            ceilings = {s: repeats_of(c.experiment, c.id) if c else [] for s, c in sources.items()}
            levels.append({"level": level, "cell": cell.id, "knobs": cell.knobs, "ceilings": ceilings})
        groups.append({"knobs": group["knobs"], "levels": levels})
    return json.dumps(groups, sort_keys=True)


def search_message(wildcards):
    """The line a dry run prints for checkpoint search before the ceilings exist (feedbench.search.dry_run_line)."""
    axis = SEARCHED[wildcards.experiment]
    groups = search_groups(list(CELLS.values()), wildcards.experiment, axis)
    levels = {level for group in groups for level in group["cells"]}
    return feedbench_search.dry_run_line(wildcards.experiment, axis, sorted(levels), len(groups))


def search_axis(wildcards):
    return SEARCHED[wildcards.experiment]


def search_baseline(wildcards):
    return next(c.id for (e, _), c in CELLS.items() if e == wildcards.experiment and c.baseline)


def cell_of(wildcards):
    key = (wildcards.experiment, wildcards.cell)
    if key not in CELLS:
        raise WorkflowError(f"no cell '{wildcards.cell}' in experiment '{wildcards.experiment}' of the config")
    return CELLS[key]


def attempt(result_path):
    """Which attempt at a cell and repeat this run makes: the retry of failed cells.

    A measured result keeps the attempt it ran as, so its params (which carry
    the attempt) are unchanged and Snakemake leaves it alone; a failed one asks
    for a new attempt, named after the failure, so the params trigger reruns
    exactly the failed cells. A damaged result (unreadable, not a mapping, or
    refused by the result schema: feedbench.result.read_result) counts as
    failed, its retry named after its bytes. A dry run sees the same: nothing
    is moved or deleted to make a retry happen.
    """
    if not os.path.exists(result_path):
        return "first"
    try:
        result = read_result(result_path)
    except UnusableResult as damage:
        return f"retry-after-damaged-{damage.tag}" if config["retry_failed"] else "first"
    if result["status"] == "ok" or not config["retry_failed"]:
        return (result.get("cell") or result.get("requested") or {}).get("attempt", "first")
    return f"retry-after-{result['finished_at']}"


def cell_knobs(wildcards):
    """The knobs of the job as one JSON text (also valid YAML): the bench rule's `params.cell`.

    Non-ASCII characters are written as themselves, not as \\u escapes, which
    PyYAML would read back as lone surrogates (an emoji in a data_dir, say).
    """
    path = result_path(wildcards.experiment, wildcards.cell, wildcards.repeat)
    knobs = dict(cell_of(wildcards).labelled(int(wildcards.repeat)), attempt=attempt(path))
    if knobs.get("python_path"):  # a change to the user's code reruns the cells that use it
        knobs["code"] = user_code(tuple(knobs["python_path"]))
    return json.dumps(knobs, sort_keys=True, ensure_ascii=False)


def images_read(knobs):
    """The generated image folder for a cell that reads it, else nothing: the bench rule's input `images`."""
    return IMAGES_DIR if knobs.get("data_dir") == IMAGES_DIR else []


def bench_inputs():
    """Rule bench's inputs (`input: **bench_inputs()`): `images` (images_read, per_cell) when a cell of the run reads
    the generated images, else none at all.

    Snakemake spends time on every job with an input, even an empty one: about 0.3 s of CPU at 10,000 cells
    (docs/performance.md, "Workflow DAG").
    """
    images = per_cell(images_read)
    return {} if images == [] else {"images": images}


# Resources from the cell (README: "Resources of a cell"): feedbench.resources, which the launcher uses too. Knobs
# a cell does not set take the harness's defaults.
def per_cell(of_knobs):
    """An input, the threads or a resource of rule bench, as a constant when every cell of the run has the same,
    else a function of the job that looks it up for the job's cell.

    Snakemake calls a function of the job for every job, inspecting its signature each time, and a constant never:
    at 10,000 cells each function costs seconds (docs/performance.md, "Workflow DAG"). Most runs have one-process
    cells only, whose Slurm resources (nodes, tasks, mpi...) are the same for all; they vary in runs that mix in
    multi-process cells, which then pay for them.
    """
    values = [of_knobs(cell.knobs) for cell in CELLS.values()]
    if values and all(value == values[0] for value in values):
        return values[0]

    def of_the_job(wildcards):
        return of_knobs(cell_of(wildcards).knobs)

    of_the_job.__name__ = f"cell_{of_knobs.__name__}"
    return of_the_job


def cell_mem_mb(wildcards, threads):
    """Per node, from the threads Snakemake gives the job (capped at --cores): always a function of the job."""
    return cell_resources.mem_mb(cell_of(wildcards).knobs, threads)


def plot_spec(wildcards):
    return config["experiments"][wildcards.experiment]["plot"]


def plot_title(wildcards):
    return config["experiments"][wildcards.experiment].get("title", wildcards.experiment)


# On Slurm (the Snakefile's onstart and onerror; docs/reliability-slurm.md).
def check_cells_fit_slurm_nodes():
    """Refuse, before any job, a cell that needs more CPUs per node than the partition's nodes have."""
    try:
        partition, cpus = feedbench_slurm.node_cpus(feedbench_slurm.bench_resource(workflow, "slurm_partition"))
    except ValueError as error:
        raise WorkflowError(str(error)) from None
    except (OSError, subprocess.SubprocessError) as error:  # no sinfo here: sbatch will judge each cell
        print(f"feedbench: cannot read the nodes' CPUs with sinfo ({error}); cells are not checked", file=sys.stderr)
        return
    error = feedbench_slurm.cells_fit_error(((e, c, cell.knobs) for (e, c), cell in CELLS.items()), partition, cpus)
    if error:
        raise WorkflowError(error)


def report_lost_cells(log):
    """After lost jobs: a lost.json for each lost cell (feedbench.slurm.record_lost_cells), then the summary, plots
    and report from everything there is."""
    cells = (
        (experiment, cell_id, repeat, CELLS[(experiment, cell_id)].labelled(repeat))
        for experiment, cell_id in chosen_cells()
        for repeat in range(1, REPEATS + 1)
    )
    paths, lost = feedbench_slurm.record_lost_cells(cells, log)
    if not lost:
        return
    from feedbench.aggregate import load_results, read_summary, write_summary
    from feedbench.plots import plot_experiment
    from feedbench.report import write_report

    write_summary(load_results(paths), "results/summary.csv")
    plots = []
    for name, spec in config["experiments"].items():
        if spec.get("plot"):
            plots.append(f"results/plots/{name}.svg")
            summary = read_summary("results/summary.csv")
            plot_experiment(summary, name, spec["plot"], plots[-1], title=spec.get("title", name))
    # The report's templates are the package's own (feedbench/templates), as for rule report.
    write_report(
        "results/summary.csv",
        plots,
        paths,
        dict(config),
        config_hash(),
        "results/report/index.html",
        references=REFERENCES,
    )
    # Dated 1970, older than every result: the next run makes them again, and runs the lost cells
    # they need (Snakemake does not rerun a missing input of an output that is up to date).
    for path in ["results/summary.csv", *plots, "results/report/index.html"]:
        os.utime(path, (0, 0))
    print(
        f"feedbench: {len(lost)} cell(s) lost on Slurm, listed in results/report/index.html; the next run runs them"
        f" again: {'; '.join(lost)}",
        file=sys.stderr,
    )
