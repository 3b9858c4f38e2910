"""Benchmark: aggregate + plots + report for 1,000 cell results (target: under 30 s).

    .venv/bin/python benchmarks/report_1000_cells.py [--cells 1000] [--repeats 4] [--out DIR]

The 1,000 result.json files are synthesised: four real cells are run with
the harness (a loader, a train, a transfer and a failing cell), then copied
with varied labels and knobs (experiment, cell id, repeat, num_workers,
batch_size) into the workflow's layout. The measured numbers of the copies
are those of the real cells: this times feedbench's analysis, it says
nothing about the machine. Each stage is timed in this process, as the
Snakemake rules would run it minus the interpreter start.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import _checkout  # noqa: F401  (this checkout's feedbench, not the venv's: benchmarks/_checkout.py)
from feedbench.analysis.aggregate import load_results, read_summary, write_summary
from feedbench.analysis.plots import plot_experiment
from feedbench.analysis.report import write_report
from feedbench.harness.runner import run
from helpers.real_results import run_failing_cell

WORKERS, BATCHES = [0, 1, 2, 4, 8], [16, 32, 64, 128, 256]
KINDS = [{"kind": "line"}, {"kind": "bar"}, {"kind": "phases"}, {"kind": "heatmap"}]


def real_cells(root: str) -> dict[str, dict]:
    """One real result per kind of cell, run now by the harness."""
    fast = {"steps": 10, "warmup_steps": 2}
    specs = {
        "loader": {**fast, "scenario": "loader", "model": "none", "image_size": 32},
        "train": {**fast, "scenario": "train", "model": "mlp", "input_size": 256, "width": 256},
        "transfer": {
            "scenario": "transfer",
            "steps": 3,
            "transfer_sizes": [65536, 262144, 1048576],
        },
    }
    results = {}
    for name, knobs in specs.items():
        run(knobs, os.path.join(root, "seed", name))
        with open(os.path.join(root, "seed", name, "result.json")) as f:
            results[name] = json.load(f)
    with open(run_failing_cell(os.path.join(root, "seed"))) as f:
        results["failed"] = json.load(f)
    return results


def synthesise(
    root: str, seeds: dict[str, dict], cells: int, repeats: int
) -> tuple[list[str], dict]:
    """Copies of the real results with varied labels and knobs, laid out as
    results/cells/<e>/<c>/rep<k>/result.json.

    Each experiment is a 5 x 5 matrix (num_workers x batch_size) x `repeats`.
    """
    per_experiment = len(WORKERS) * len(BATCHES) * repeats
    kinds = [
        "train",
        "loader",
        "train",
        "loader",
        "train",
        "loader",
        "train",
        "loader",
        "transfer",
        "train",
    ]
    paths, experiments = [], {}
    for index in range(cells):
        e, within = divmod(index, per_experiment)
        point, repeat = divmod(within, repeats)
        workers, batch = (
            WORKERS[point // len(BATCHES) % len(WORKERS)],
            BATCHES[point % len(BATCHES)],
        )
        experiment = f"exp{e:02d}"
        seed = kinds[e % len(kinds)]
        if seed == "train" and point == 0 and repeat == repeats - 1:
            seed = "failed"  # one failed repeat per training experiment
        result = json.loads(json.dumps(seeds[seed]))
        cell = f"num_workers-{workers}_batch_size-{batch}"
        labels = {
            "experiment": experiment,
            "cell": cell,
            "repeat": repeat,
            "num_workers": workers,
            "batch_size": batch,
        }
        result["requested"].update(labels)
        if result["cell"]:
            result["cell"].update(labels)
        path = os.path.join(root, "cells", experiment, cell, f"rep{repeat}", "result.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(result, f)
        paths.append(path)
        x = {"transfer": "size_bytes"}.get(seed, "num_workers")
        spec = {"x": x, "y": "samples_per_s", "hue": "batch_size", **KINDS[e % len(KINDS)]}
        experiments.setdefault(
            experiment,
            {
                "title": f"Synthetic experiment {e} ({seed})",
                "base": {"scenario": seeds[seed]["cell"]["scenario"]},
                "matrix": {"num_workers": WORKERS, "batch_size": BATCHES},
                "plot": spec,
            },
        )
    return paths, {"defaults": {"repeats": repeats}, "experiments": experiments}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cells", type=int, default=1000, help="result.json files to synthesise (cell x repeat)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=4,
        help="repeats per cell: 4 gives 10 experiments of 25 cells, 1 gives 40",
    )
    parser.add_argument("--out", help="keep everything here (default: a temporary folder, removed)")
    args = parser.parse_args()
    root = args.out or tempfile.mkdtemp(prefix="feedbench-bench-")
    try:
        seeds = real_cells(root)
        paths, config = synthesise(root, seeds, args.cells, args.repeats)
        timings = {}
        start = time.perf_counter()
        write_summary(load_results(paths), os.path.join(root, "summary.csv"))
        timings["aggregate"] = time.perf_counter() - start

        start = time.perf_counter()
        summary, svgs = read_summary(os.path.join(root, "summary.csv")), []
        for name, experiment in config["experiments"].items():
            svgs.append(os.path.join(root, "plots", f"{name}.svg"))
            plot_experiment(summary, name, experiment["plot"], svgs[-1], experiment["title"])
        timings["plots"] = time.perf_counter() - start

        start = time.perf_counter()
        html = os.path.join(root, "report", "index.html")
        write_report(os.path.join(root, "summary.csv"), svgs, paths, config, "benchmark", html)
        timings["report"] = time.perf_counter() - start

        total = sum(timings.values())
        print(
            f"{len(paths)} results, {len(config['experiments'])} experiments, report "
            f"{os.path.getsize(html) / 1e6:.1f} MB"
        )
        for stage, seconds in timings.items():
            print(f"  {stage:10} {seconds:6.2f} s")
        print(
            f"  {'total':10} {total:6.2f} s  (target < 30 s: {'met' if total < 30 else 'MISSED'})"
        )
        return 0 if total < 30 else 1
    finally:
        if not args.out:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
