# Config validation, matrix expansion and the helpers the rules call.
# Everything that decides something lives here, in named functions: the rules
# only wire files together.

# The Snakefile has put the feedbench package beside it (PACKAGE_ROOT) on sys.path and PYTHONPATH.

import copy
import functools
import hashlib
import json
import os

from snakemake.exceptions import WorkflowError
from snakemake.utils import update_config

from feedbench.cell import ranks
from feedbench.config import ConfigError, count_values, one_line, read_config_file, validate_config
from feedbench.knobs import KNOBS
from feedbench.matrix import build_cells, harness_fingerprint
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
        config["python_path"] = [os.path.normpath(os.path.join(config_dir("python_path"), p)) for p in config["python_path"]]
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
RESULTS = [
    f"results/cells/{experiment}/{cell}/rep{repeat}/result.json"
    for (experiment, cell) in CELLS
    for repeat in range(1, REPEATS + 1)
]
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
    path = f"results/cells/{wildcards.experiment}/{wildcards.cell}/rep{wildcards.repeat}/result.json"
    knobs = dict(cell_of(wildcards).labelled(int(wildcards.repeat)), attempt=attempt(path))
    if knobs.get("python_path"):  # a change to the user's code reruns the cells that use it
        knobs["code"] = user_code(tuple(knobs["python_path"]))
    return json.dumps(knobs, sort_keys=True, ensure_ascii=False)


def cell_inputs(wildcards):
    """The generated image folder, for cells that read it."""
    return {"images": IMAGES_DIR} if cell_of(wildcards).knobs.get("data_dir") == IMAGES_DIR else {}


# Resources from the cell (README: "Resources of a cell"). Knobs a cell does not
# set take the harness's defaults (feedbench.knobs.KNOBS).
def knob(wildcards, name):
    cell = cell_of(wildcards)
    return cell.knobs[name] if name in cell.knobs else KNOBS[name].default


def cell_threads(wildcards):
    """Per node: every rank (gpus_per_node) plus its loader workers. Snakemake caps it at --cores."""
    return (knob(wildcards, "num_workers") + 1) * knob(wildcards, "gpus_per_node")


def cell_mem_mb(wildcards, threads):
    """2 GiB per rank, 1 GiB per loader worker."""
    ranks = knob(wildcards, "gpus_per_node")
    return 2048 * ranks + 1024 * (threads - ranks)


def cell_ranks(wildcards):
    """Processes of the cell, by the harness's own rule."""
    return ranks(knob(wildcards, "parallel"), knob(wildcards, "nodes"), knob(wildcards, "gpus_per_node"))


def cell_cpus_per_task(wildcards):
    """Slurm's --cpus-per-task: a rank and its loader workers (the whole cell when it is one process)."""
    return knob(wildcards, "num_workers") + 1 if cell_ranks(wildcards) > 1 else cell_threads(wildcards)


def cell_gpus(wildcards):
    """GPUs of the whole job when the cell may use them (device cuda or auto), else 0."""
    if knob(wildcards, "device") not in ("cuda", "auto"):
        return 0
    return knob(wildcards, "gpus_per_node") * knob(wildcards, "nodes")


def cell_tasks(wildcards):
    """Slurm tasks of the whole job, when one per node (or one in all) says it; else 0 (unset).

    Several ranks per node go through tasks_per_node instead, so that Slurm
    cannot pack 3 of 4 ranks on one node: the plugin takes one or the other.
    """
    return cell_ranks(wildcards) if knob(wildcards, "gpus_per_node") == 1 or cell_ranks(wildcards) == 1 else 0


def cell_tasks_per_node(wildcards):
    return knob(wildcards, "gpus_per_node") if not cell_tasks(wildcards) else 0


def cell_tasks_per_gpu(wildcards):
    """One rank per GPU; 0 (unset) without GPUs or for dp, whose one process drives them all."""
    return 1 if cell_gpus(wildcards) and cell_ranks(wildcards) > 1 else 0


def cell_mpi(wildcards):
    """'srun' for multi-process cells: the job's shell runs once and the launcher starts the ranks with srun."""
    return "srun" if cell_ranks(wildcards) > 1 else ""


def cell_nodes(wildcards):
    return knob(wildcards, "nodes")


def plot_spec(wildcards):
    return config["experiments"][wildcards.experiment]["plot"]


def plot_title(wildcards):
    return config["experiments"][wildcards.experiment].get("title", wildcards.experiment)
