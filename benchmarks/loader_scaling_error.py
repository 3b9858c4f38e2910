"""The loader's prediction from one core to two: the loader rows of docs/results/prediction-error-loader.md.

    PYTHONPATH=workflow:tests .venv/bin/python benchmarks/loader_scaling_error.py [--repeats 3]

For the JPEG folder (`dataset: images`) and examples/own-pipeline (tests/loader_scaling.py has the cells): the
loader alone at 0, 1 and 2 workers with the affinity mask at one core, and at 2 workers with two cores, repeat by
repeat. The scaling model (feedbench.analysis.loader_scaling) is fitted to the one-core cells only (its curve: the
cells with 1 and 2 workers) and predicts two workers on two cores; the error is the two-core cells' median
samples/s against that prediction. Prints the
markdown rows, the fit and every cell's samples/s and CPU ms per sample. Run it with nothing else on the machine:
the prediction is what two free cores deliver (tests/test_loader_scaling.py says why a CPU hog breaks it).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from feedbench.analysis.loader_scaling import fit_scaling, fit_text, loader_ceiling, loader_point
from loader_scaling import PIPELINES, measure

NAMES = {"images": "JPEG folder (`dataset: images`)", "shapes": "examples/own-pipeline (shapes)"}


def predicted_and_measured(runs) -> tuple[float, list[float], object]:
    """(prediction for 2 workers on 2 cores from the one-core cells, the two-core cells' samples/s, the fit)."""
    fit = fit_scaling([loader_point(result) for workers, cores, result in runs if cores == 1])
    measured = [result["metrics"]["samples_per_s"] for workers, cores, result in runs if cores == 2]
    return loader_ceiling(fit, cores=2, workers=2), measured, fit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each cell (default 3)")
    repeats = parser.parse_args().repeats
    root = tempfile.mkdtemp(prefix="loader-scaling-")
    rows = []
    for pipeline in PIPELINES:
        start = time.perf_counter()
        runs = measure(root, pipeline, repeats)
        predicted, measured, fit = predicted_and_measured(runs)
        median = statistics.median(measured)
        error = 100 * (median / predicted - 1)
        print(f"{pipeline}: {len(runs)} runs in {time.perf_counter() - start:.0f} s; fit on one core: {fit_text(fit)}")
        for workers, cores, result in runs:
            p = loader_point(result)
            cpu = f"workers {p.worker_cpu_ms or 0:.2f}, main {p.main_cpu_ms or 0:.2f} CPU ms/sample"
            print(f"  W={workers} cores={cores}: {p.samples_per_s:.1f} samples/s ({cpu})")
        spread = ", ".join(f"{value:.0f}" for value in measured)
        rows.append(
            f"| {NAMES[pipeline]} | {fit.worker_cpu_ms:.2f} + {fit.main_cpu_ms:.2f} | {fit.x1:.0f} "
            f"| {predicted:.0f} | {median:.0f} ({spread}) | {error:+.1f} % |"
        )
    print(
        "\n| pipeline | CPU ms per sample, workers + main | X1: one core, 1 and 2 workers | predicted, 2 cores "
        "| measured, 2 cores: median (repeats) | error |"
    )
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
