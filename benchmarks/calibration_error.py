"""How far the calibration workloads measure from their analytic values: the margins behind
tests/harness/test_calibration.py.

    PYTHONPATH=workflow:tests .venv/bin/python benchmarks/calibration_error.py
    python3 -c "while 1: pass" & PYTHONPATH=workflow:tests .venv/bin/python benchmarks/calibration_error.py; kill %1
    PYTHONPATH=workflow:tests .venv/bin/python benchmarks/calibration_error.py --device cuda   # on a GPU machine
    ... calibration_error.py --repeats 1 --cases balanced --workers 0    # the smallest run (the test suite's)

Runs the 54 calibration runs (tests/helpers/calibration.py: the 9 training cells and their ceilings,
3 repeats each, with its steps) and prints, for every training cell, the error of its median
samples/s against the analytic value, each repeat's error, and its stall against the analytic stall.
The test allows 5 % and 3 points; the worst error is printed last. The second command holds one core
busy meanwhile, as the timing tests must bear. The third runs the same cells on a GPU: the sleep
model then spins the GPU (torch.cuda._sleep) and CUDA events time the phases.
"""  # noqa: E501

from __future__ import annotations

import argparse
import tempfile
import time

import _checkout  # noqa: F401  (this checkout's feedbench, not the venv's: benchmarks/_checkout.py)
import jsonschema  # noqa: F401  (the summary validates each result: missing, fail now, not after the runs)
from feedbench.analysis.aggregate import load_results
from feedbench.core.metrics import PHASES as PHASE_COLUMNS
from helpers.calibration import (
    BATCH,
    CASES,
    COMMON,
    REPEATS,
    WORKERS,
    compute_ms,
    expected,
    measure,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where the cells run (default: cpu)",
    )
    parser.add_argument(
        "--repeats", type=int, default=REPEATS, help=f"runs of each cell (default {REPEATS})"
    )
    parser.add_argument(
        "--cases", nargs="+", choices=list(CASES), default=list(CASES), help="default: all"
    )
    parser.add_argument(
        "--workers",
        nargs="+",
        type=int,
        choices=WORKERS,
        default=list(WORKERS),
        help="default: all",
    )
    args = parser.parse_args()
    COMMON["device"] = args.device
    start = time.perf_counter()
    paths = measure(
        tempfile.mkdtemp(prefix="calibration-"),
        repeats=args.repeats,
        cases=args.cases,
        workers_levels=args.workers,
    )
    summary = load_results(paths)
    print(f"{len(paths)} runs on {COMMON['device']} in {time.perf_counter() - start:.0f} s")
    worst = 0.0
    for case in args.cases:
        for workers in args.workers:
            step_ms, stall_pct = expected(compute_ms(case, workers), workers, COMMON["device"])
            analytic = BATCH / (step_ms / 1000)
            rows = summary[summary["cell"] == f"{case}-{workers}"]
            error = 100 * (rows["samples_per_s"].median() / analytic - 1)
            repeats = ", ".join(
                f"{100 * (value / analytic - 1):+.1f}" for value in rows["samples_per_s"]
            )
            stall = rows["stall_pct"].median() - stall_pct
            print(
                f"{case:>13} W={workers}: samples/s {error:+.2f} % (repeats {repeats}), "
                f"stall {stall:+.2f} points"
            )
            worst = max(worst, abs(error))
            # where a GPU step's time goes: the host's wait against the GPU's idling
            if COMMON["device"] == "cuda":
                phases = ", ".join(
                    f"{name} {rows[f'{name}_ms'].median():.1f}"
                    for name in PHASE_COLUMNS
                    # device_prep only where a cell does device work
                    if rows[f"{name}_ms"].notna().any()
                )
                print(f"{'':>19}median ms: step {rows['step_ms_median'].median():.1f}, {phases}")
    print(f"worst samples/s error: {worst:.2f} % (the test allows 5 %)")


if __name__ == "__main__":
    main()
