"""Benchmark: a dry run of feedbench's workflow against Snakemake's own floor, the same number of
trivial jobs.

    PYTHONPATH=workflow .venv/bin/python benchmarks/dag_dry_run.py               # 10,000 cells, one round
    PYTHONPATH=workflow .venv/bin/python benchmarks/dag_dry_run.py 1000 --rounds 3
    PYTHONPATH=workflow .venv/bin/python benchmarks/dag_dry_run.py --compare /tmp/before/Snakefile  # before/after

feedbench: one experiment whose matrix has that many cells (10 levels per axis:
num_workers x batch_size x hidden_layers x seed), 1 repeat, one plot. The dry
run validates the config, expands the matrix, checks every cell with the
harness's parse_cell and plans every bench job plus aggregate, plot and report.

Snakemake's floor: a Snakefile with one rule and as many jobs, each with params
of the same size as the bench job's (the cell's knobs as JSON, the harness
fingerprint, the cell's folder), looked up from a table, and one rule that
gathers them. Both are whole `python -m snakemake --dry-run` processes in fresh
folders, run alternately when there are several rounds. Target: feedbench
within 1.2x of the floor. Prints both wall times and their ratio, then a third
figure that explains it: the trivial jobs shaped like rule bench (a log, a
benchmark file, its resources, threads and mem_mb as functions of the job). --compare plans the same
matrix with another checkout's Snakefile too (`git archive REV | tar -x -C
DIR`), in the same rounds: before and after figures from one run.
"""  # noqa: E501

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import _checkout  # noqa: F401  (this checkout's feedbench, not the venv's: benchmarks/_checkout.py)
import yaml
from feedbench.plan.matrix import build_cells

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_RATIO = 1.2

# Snakemake's floor: the same jobs with params of the same size, nothing computed per job.
TRIVIAL_SNAKEFILE = """
import json

PARAMS = json.load(open(config["params"]))


rule all:
    input:
        [f"results/cells/{name}/result.json" for name in PARAMS],


rule job:
    output:
        "results/cells/{name}/result.json",
    params:
        cell=lambda wildcards: PARAMS[wildcards.name]["cell"],
        harness=lambda wildcards: PARAMS[wildcards.name]["harness"],
        dir="results/cells/{name}",
    shell:
        "echo {params.cell:q} > {output}"
"""

# The floor of rule bench's shape for this matrix (one-process cells: core.resources): the same jobs
# with a log, a benchmark file, threads and mem_mb as functions of the job (they vary with
# num_workers) and the other resources as constants. This splits feedbench's cost into the rule's
# shape, which Snakemake handles for every job, and feedbench's own code (the parse, the matrix, the
# functions of the job).
SHAPED_SNAKEFILE = TRIVIAL_SNAKEFILE.replace(
    """        dir="results/cells/{name}",
""",
    """        dir="results/cells/{name}",
    log:
        "logs/{name}.log",
    benchmark:
        "results/cells/{name}/benchmark.tsv"
    threads: lambda wildcards: 1
    resources:
        mem_mb=lambda wildcards, threads: 2048,
        runtime=30,
        gpu=0,
        nodes=1,
        tasks=1,
        tasks_per_node=0,
        tasks_per_gpu=0,
        mpi="",
        bench_slots=1,
""",
)


def config(cells: int) -> dict:
    axes = {
        "num_workers": list(range(10)),
        "batch_size": [8 * (i + 1) for i in range(10)],
        "hidden_layers": list(range(10)),
        "seed": list(range(10)),
    }
    matrix, size = {}, 1
    for axis, levels in axes.items():
        if size >= cells:
            break
        take = min(len(levels), cells // size)
        matrix[axis] = levels[:take]
        size *= take
    assert size == cells, f"{cells} is not a product of levels of 10"
    return {
        "defaults": {"repeats": 1, "steps": 5, "device": "cpu"},
        "experiments": {
            "big": {
                "title": "DAG benchmark",
                "base": {"scenario": "train", "dataset": "synthetic", "model": "mlp"},
                "matrix": matrix,
                "plot": {"x": "num_workers", "kind": "line"},
            }
        },
    }


def trivial_params(cells: int) -> dict[str, dict[str, str]]:
    """Per job, params as long as the bench job's: the knobs as JSON (as common.smk's cell_knobs),
    16 hex digits."""
    params = {}
    for cell in build_cells(config(cells), check=False):
        knobs = json.dumps(dict(cell.labelled(1), attempt="first"), sort_keys=True)
        params[f"{cell.experiment}/{cell.id}/rep1"] = {"cell": knobs, "harness": "0" * 16}
    return params


CPU_S: list[float] = []


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's finished children: steadier than wall time on a
    busy machine."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def dry_run(snakefile: str, workdir: str, configfile: str) -> tuple[int, float]:
    """Jobs planned and whole-process wall seconds of one `snakemake --dry-run`; its CPU seconds go
    to CPU_S."""
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        snakefile,
        "--directory",
        workdir,
        "--configfile",
        configfile,
        "--cores",
        "2",
        "--dry-run",
        "--quiet",
        "rules",
    ]
    start, cpu = time.perf_counter(), children_cpu_s()
    run = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    CPU_S.append(children_cpu_s() - cpu)
    if run.returncode != 0:
        sys.exit(run.stdout[-2000:] + run.stderr[-2000:])
    return int(re.search(r"^total\s+(\d+)", run.stdout, re.M).group(1)), wall


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", type=int, nargs="?", default=10000)
    parser.add_argument(
        "--rounds", type=int, default=1, help="alternate runs of each; the figures are medians"
    )
    parser.add_argument(
        "--compare", metavar="SNAKEFILE", help="another checkout's Snakefile, planned the same way"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        feedbench_config, trivial_config = (
            os.path.join(tmp, "feedbench.yaml"),
            os.path.join(tmp, "trivial.yaml"),
        )
        with open(feedbench_config, "w") as f:
            yaml.safe_dump(config(args.cells), f)
        with open(os.path.join(tmp, "params.json"), "w") as f:
            json.dump(trivial_params(args.cells), f)
        with open(trivial_config, "w") as f:
            yaml.safe_dump({"params": os.path.join(tmp, "params.json")}, f)
        snakefiles = {"trivial": TRIVIAL_SNAKEFILE, "shaped": SHAPED_SNAKEFILE}
        for name, text in snakefiles.items():
            with open(os.path.join(tmp, f"{name}.smk"), "w") as f:
                f.write(text)
        walls: dict[str, list[float]] = {
            "feedbench": [],
            "trivial": [],
            "shaped": [],
            "compared": [],
        }
        cpus: dict[str, list[float]] = {name: [] for name in walls}
        for i in range(args.rounds):
            if args.compare:
                walls["compared"].append(
                    dry_run(args.compare, os.path.join(tmp, f"compared{i}"), feedbench_config)[1]
                )
                cpus["compared"].append(CPU_S[-1])
            jobs, wall = dry_run(
                os.path.join(ROOT, "Snakefile"),
                os.path.join(tmp, f"feedbench{i}"),
                feedbench_config,
            )
            walls["feedbench"].append(wall)
            cpus["feedbench"].append(CPU_S[-1])
            for name in snakefiles:
                trivial_jobs, wall = dry_run(
                    os.path.join(tmp, f"{name}.smk"),
                    os.path.join(tmp, f"{name}{i}"),
                    trivial_config,
                )
                walls[name].append(wall)
                cpus[name].append(CPU_S[-1])
    median = {name: statistics.median(w) for name, w in walls.items() if w}
    cpu = {name: statistics.median(c) for name, c in cpus.items() if c}
    ratio = median["feedbench"] / median["trivial"]
    each = {name: ", ".join(f"{w:.1f}" for w in ws) for name, ws in walls.items()}
    print(
        f"feedbench: {args.cells} cells, {jobs} jobs planned: {median['feedbench']:.1f} s ("
        f"{each['feedbench']})"
    )
    print(
        f"snakemake: {trivial_jobs} trivial jobs, params of the same size: "
        f"{median['trivial']:.1f} s ({each['trivial']})"
    )
    print(
        f"ratio: {ratio:.2f} (target <= {TARGET_RATIO}: "
        f"{'met' if ratio <= TARGET_RATIO else 'MISSED'})"
    )
    print(
        "snakemake, the same jobs shaped like rule bench (log, benchmark, resources; threads, "
        f"mem_mb functions): {median['shaped']:.1f} s ({each['shaped']}); feedbench / shaped: "
        f"{median['feedbench'] / median['shaped']:.2f}"
    )
    print(
        f"CPU seconds (user + system; medians): feedbench {cpu['feedbench']:.1f}, trivial "
        f"{cpu['trivial']:.1f}, shaped {cpu['shaped']:.1f}; ratio "
        f"{cpu['feedbench'] / cpu['trivial']:.2f}, feedbench / shaped "
        f"{cpu['feedbench'] / cpu['shaped']:.2f}"
    )
    if args.compare:
        print(
            f"compared, CPU: {cpu['compared']:.1f} s; ratio to the trivial jobs: "
            f"{cpu['compared'] / cpu['trivial']:.2f}"
        )
        print(
            f"compared, {args.compare}: {median['compared']:.1f} s ({each['compared']}); "
            f"ratio to the trivial jobs: {median['compared'] / median['trivial']:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
