"""The calibration workloads, measured once for the timing tests that hold them against ground
truth.

A sleep model computes for C ms per step (compute_ms) and a loader takes d ms per sample
(sample_delay_ms), so a batch of B costs B*d ms in one worker. With W workers a batch arrives every
B*d/max(W,1) ms. Without workers loading and compute run in series; with workers they overlap:
  W = 0: step = B*d + C,            stall = B*d / step
  W > 0: step = max(C, B*d/W),      stall = max(0, B*d/W - C) / step
On a GPU the sleep model spins the GPU without holding the host, so with W = 0 the host loads the
next batch while the GPU computes: W = 0 steps as W = 1 does, but for the window's first step, which
starts synchronised with nothing in flight and pays B*d + C (benchmarks/calibration_error.py
--device cuda; on an H200). tests/harness/test_calibration.py checks each training cell against
these values, tests/analysis/test_predict.py the prediction from the cell's ceilings. Both read one
set of runs (`measure`): every training cell with its loader and compute ceilings, 3 repeats each,
as the workflow runs them (a compute ceiling has no workers, so W = 0 and W = 1, with the same C,
share theirs, as in the workflow).

The runs go one at a time, in this process, in `make test`'s timing phase, with nothing else
running. Three at once (a pool of processes) made the one-worker cases 4-6 % slow on this 2-core
machine while another process kept one core busy, where the same cases run one at a time passed:
these cells are sleeps, but their loader workers, collate and monitor threads still need a core at
the moment they wake.

benchmarks/calibration_error.py prints how far each case lies from its analytic values. With 8 steps
and a CPU hog on one core (2026-11-24): within 1.3 to 2.1 % of its samples/s and 0.9 to 1.4 points
of its stall, its 3 repeats within 0.4 % of each other.
"""

from __future__ import annotations

import json
import os

# 128 ms to load one batch in one worker: fixed per-step costs (~1-2 ms) stay small
BATCH, DELAY_MS = 4, 32.0
LOAD_MS = BATCH * DELAY_MS
# compute as a multiple of the batch interval
CASES = {"loader-bound": 0.4, "balanced": 0.9, "compute-bound": 2.0}
WORKERS = (0, 1, 2)
# a single run on a busy machine can lose 15 % to one burst of other load: the median repeat counts
REPEATS = 3
COMMON = dict(
    dataset="synthetic",
    image_size=8,
    sample_delay_ms=DELAY_MS,
    batch_size=BATCH,
    # an even count: two workers deliver batches in pairs. The 54 runs take 119 s (207 s with 20
    # steps)
    steps=8,
    warmup_steps=4,
    num_samples=4096,
    model="sleep",
    # the trainer's one intra-op thread: nothing here needs more, and it keeps the CPU free
    torch_threads=1,
    device="cpu",
)


def compute_ms(case: str, workers: int) -> float:
    return CASES[case] * LOAD_MS / max(workers, 1)


def expected(compute: float, workers: int, device: str = "cpu") -> tuple[float, float]:
    """(step ms, stall %) of a training cell with `compute` ms per step and `workers` loader
    workers."""
    if workers == 0 and device == "cpu":
        step = LOAD_MS + compute
        return step, 100 * LOAD_MS / step
    interval = LOAD_MS / max(workers, 1)
    step = max(compute, interval)
    # on a GPU: the first step fills the pipeline, the mean step of the window carries it
    if workers == 0:
        steps = COMMON["steps"]
        window = (steps - 1) * step + LOAD_MS + compute
        return window / steps, 100 * (LOAD_MS + (steps - 1) * max(0.0, interval - compute)) / window
    return step, 100 * max(0.0, interval - compute) / step


def planned(
    repeats: int = REPEATS, cases=tuple(CASES), workers_levels=WORKERS
) -> list[tuple[str, int, dict]]:
    """(cell, repeat, knobs) of every run, repeat by repeat, so that a burst of other load falls on
    the cells and their ceilings alike rather than on one of them. Fewer repeats, cases or worker
    counts: a smaller run of the same cells (benchmarks/calibration_error.py)."""
    runs = []
    for repeat in range(1, repeats + 1):
        computes = {}
        for workers in workers_levels:
            runs.append((f"loader-{workers}", repeat, dict(scenario="loader", num_workers=workers)))
            for case in cases:
                knobs = dict(num_workers=workers, compute_ms=compute_ms(case, workers))
                runs.append((f"{case}-{workers}", repeat, dict(scenario="train", **knobs)))
                computes.setdefault(knobs["compute_ms"], f"compute-{case}-{workers}")
        runs += [
            (name, repeat, dict(scenario="compute", compute_ms=ms)) for ms, name in computes.items()
        ]
    return runs


def measure(root: str, **size) -> list[str]:
    """Run every planned cell (planned(**size)) under `root` (<cell>/rep<k>) with the harness; their
    result paths in plan order."""
    from feedbench.harness.runner import run

    paths = []
    for cell, repeat, knobs in planned(**size):
        out = os.path.join(root, cell, f"rep{repeat}")
        code = run(
            {**COMMON, **knobs, "experiment": "calibration", "cell": cell, "repeat": repeat}, out
        )
        with open(os.path.join(out, "result.json")) as f:
            assert code == 0, f"{cell} rep{repeat}: {json.load(f)['error']}"
        paths.append(os.path.join(out, "result.json"))
    return paths
