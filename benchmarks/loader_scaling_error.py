"""The loader's prediction from one core to two: the loader rows of
docs/results/prediction-error-loader.md.

    PYTHONPATH=workflow:tests .venv/bin/python benchmarks/loader_scaling_error.py [--repeats 3] [--check]

With --check, the test's cells only (tests/analysis/test_loader_scaling.py: 2 workers on one core and on two,
3 repeats), one row per pipeline with the busy share of the cells' cores and a sample's cost on one
core over two.

For the JPEG folder (`dataset: images`) and examples/own-pipeline (tests/helpers/loader_scaling.py
has the cells): the loader alone at 0, 1 and 2 workers with the affinity mask at one core, and at 2
workers with two cores, repeat by repeat. The scaling model (feedbench.analysis.loader_scaling) is
fitted to the one-core cells only (its curve: the cells with the most workers there, 2) and predicts
two workers on two cores; the error is the two-core cells' median samples/s on free cores (each
cell's rate over the cores it was offered, monitor.cpu_offered, times its cores:
analysis.loader_scaling.loader_point) against that prediction. Prints the markdown rows, the fit,
the load average before and after, and every cell's samples/s (measured, and on free cores), offered
cores and CPU ms per sample.
"""  # noqa: E501

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import _checkout  # noqa: F401  (this checkout's feedbench, not the venv's: benchmarks/_checkout.py)
from feedbench.analysis.loader_scaling import fit_scaling, fit_text, loader_ceiling, loader_point
from helpers.loader_scaling import (
    CHECK_CELLS,
    CHECK_REPEATS,
    ONE_CORE,
    PIPELINES,
    TWO_CORES,
    measure,
)

NAMES = {"images": "JPEG folder (`dataset: images`)", "shapes": "examples/own-pipeline (shapes)"}


def predicted_and_measured(runs) -> tuple[float, list[float], object]:
    """(prediction for 2 workers on 2 cores from the one-core cells, the two-core cells' samples/s,
    the fit)."""
    fit = fit_scaling([loader_point(result) for workers, cores, result in runs if cores == 1])
    measured = [loader_point(result).samples_per_s for workers, cores, result in runs if cores == 2]
    return loader_ceiling(fit, cores=2, workers=2), measured, fit


def as_measured(runs) -> float:
    """The error in % with every cell's samples/s as measured, not on free cores (the two-core
    cells' median against twice the one-core cells' with two workers: the linear curve, uncapped):
    what other load does to the comparison."""
    one = [r.metrics["samples_per_s"] for workers, cores, r in runs if cores == 1 and workers == 2]
    two = [r.metrics["samples_per_s"] for workers, cores, r in runs if cores == 2]
    return 100 * (statistics.median(two) / (2 * statistics.median(one)) - 1)


def worker_cpu_ms(runs) -> str:
    """The workers' CPU ms per sample (median over the repeats) of one and two workers on one core
    and two on two: a sample costs more the more workers there are, which is why the curve takes the
    most workers."""
    shown = []
    for cell in ((1, 1), (2, 1), (2, 2)):
        values = [loader_point(r).worker_cpu_ms for w, c, r in runs if (w, c) == cell]
        # None: the monitor took no sample of them
        values = [value for value in values if value is not None]
        shown.append(f"{statistics.median(values):.2f}" if values else "n/a")
    return " / ".join(shown)


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def busy(runs, cores: int) -> str:
    """The median share of their offered cores the cells on `cores` kept busy
    (loader_point.busy_share)."""
    shares = [loader_point(r).busy_share for w, c, r in runs if c == cores]
    shares = [share for share in shares if share is not None]
    return f"{statistics.median(shares):.3f}" if shares else "n/a"


def cost_ratio(runs) -> str:
    """A sample's CPU ms (workers' and main process's) on one core over two, medians: 1 where it
    does not change."""
    cost = {1: [], 2: []}
    for _, cores, result in runs:
        p = loader_point(result)
        if p.worker_cpu_ms is not None and p.main_cpu_ms is not None:
            cost[cores].append(p.worker_cpu_ms + p.main_cpu_ms)
    if not cost[1] or not cost[2]:
        return "n/a"
    return f"{statistics.median(cost[1]) / statistics.median(cost[2]):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=None, help="runs of each cell (default 3)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="the test's cells only (2 workers on one core and on two), one row each",
    )
    parser.add_argument(
        "--pipelines",
        nargs="+",
        choices=list(PIPELINES),
        default=list(PIPELINES),
        help="default: both",
    )
    args = parser.parse_args()
    cells = CHECK_CELLS if args.check else ONE_CORE + TWO_CORES
    repeats = args.repeats or (CHECK_REPEATS if args.check else 3)
    root = tempfile.mkdtemp(prefix="loader-scaling-")
    rows = []
    for pipeline in args.pipelines:
        start, load = time.perf_counter(), loadavg()
        runs = measure(root, pipeline, repeats, cells)
        predicted, measured, fit = predicted_and_measured(runs)
        median = statistics.median(measured)
        error = 100 * (median / predicted - 1)
        print(
            f"{pipeline}: {len(runs)} runs in {time.perf_counter() - start:.0f} s, load average "
            f"{load} before, {loadavg()} after; fit on one core: {fit_text(fit)}"
        )
        for workers, cores, result in runs:
            p = loader_point(result)
            cpu = f"workers {p.worker_cpu_ms or 0:.2f}, main {p.main_cpu_ms or 0:.2f} CPU ms/sample"
            raw, offered = result.metrics["samples_per_s"], p.offered_cores or float("nan")
            print(
                f"  W={workers} cores={cores}: {raw:.1f} samples/s, {offered:.2f} cores offered, ",
                end="",
            )
            print(
                f"{p.samples_per_s:.1f} on free cores ({cpu}; busy "
                f"{p.busy_share or float('nan'):.3f})"
            )
        spread = ", ".join(f"{value:.0f}" for value in measured)
        if args.check:
            rows.append(
                f"| {NAMES[pipeline]} | {load} | {fit.x1:.0f} | {predicted:.0f} | {median:.0f} ("
                f"{spread}) | {busy(runs, 1)} / {busy(runs, 2)} | {cost_ratio(runs)} | "
                f"{error:+.1f} % |"
            )
            continue
        rows.append(
            f"| {NAMES[pipeline]} | {load} | {worker_cpu_ms(runs)} | {fit.main_cpu_ms:.2f} | "
            f"{fit.x1:.0f} | {predicted:.0f} | {median:.0f} ({spread}) | {error:+.1f} % | "
            f"{as_measured(runs):+.1f} % |"
        )
    if args.check:
        print(
            "\n| pipeline | load average before | X1: one core, 2 workers | predicted, 2 cores | "
            "measured, 2 cores: median (repeats) | busy share, one core / two | cost per sample, "
            "one core over two | error |"
        )
        print("|---|---|---|---|---|---|---|---|")
    else:
        print(
            "\n| pipeline | load average before | workers' CPU ms per sample: 1 and 2 on one "
            "core / 2 on two | main process's | X1: one core, 2 workers | predicted, 2 cores | "
            "measured, 2 cores: median (repeats) | error | error as measured |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
