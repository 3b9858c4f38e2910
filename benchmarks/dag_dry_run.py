"""Benchmark: how long Snakemake takes to validate the config, expand the matrix and build the DAG (a dry run).

    .venv/bin/python benchmarks/dag_dry_run.py            # 1,000 and 10,000 cells
    .venv/bin/python benchmarks/dag_dry_run.py 1000       # one size

Each size is one experiment whose matrix has that many cells (10 levels per
axis: num_workers x batch_size x hidden_layers x seed), 1 repeat, one plot;
the dry run plans every bench job plus aggregate, plot and report in a
temporary working directory. Targets: 1,000 cells under 10 s, 10,000 under 60 s.
Prints one line per size: cells, jobs planned, wall seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = {1000: 10.0, 10000: 60.0}


def config(cells: int) -> dict:
    axes = {"num_workers": list(range(10)), "batch_size": [8 * (i + 1) for i in range(10)], "hidden_layers": list(range(10)), "seed": list(range(10))}
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
        "experiments": {"big": {"title": "DAG benchmark", "base": {"scenario": "train", "dataset": "synthetic", "model": "mlp"},
                                "matrix": matrix, "plot": {"x": "num_workers", "kind": "line"}}},
    }


def dry_run(cells: int) -> tuple[int, float]:
    with tempfile.TemporaryDirectory() as workdir:
        path = os.path.join(workdir, "config.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(config(cells), f)
        command = [sys.executable, "-m", "snakemake", "-s", os.path.join(ROOT, "Snakefile"), "--directory", workdir,
                   "--configfile", path, "--cores", "2", "--dry-run", "--quiet", "rules"]
        start = time.perf_counter()
        run = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if run.returncode != 0:
            sys.exit(run.stderr[-3000:])
        jobs = int(re.search(r"^total\s+(\d+)", run.stdout, re.M).group(1))
        return jobs, wall


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or list(TARGETS)
    for cells in sizes:
        jobs, wall = dry_run(cells)
        target = TARGETS.get(cells)
        verdict = "" if target is None else f" (target < {target:g} s: {'met' if wall < target else 'MISSED'})"
        print(f"{cells} cells, {jobs} jobs planned: {wall:.1f} s{verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
