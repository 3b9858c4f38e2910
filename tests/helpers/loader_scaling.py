"""The loader cells measured under an affinity mask: the data behind
tests/analysis/test_loader_scaling.py and benchmarks/loader_scaling_error.py
(docs/results/prediction-error-loader.md).

Each cell is the loader alone (`scenario: loader`) of one pipeline, run by the harness in a process
of its own whose affinity mask holds `cores` CPUs, those other work kept least busy just before
(feedbench.harness.masked: quietest, then os.sched_setaffinity before the harness starts; its loader
workers inherit the mask), with `torch_threads: 1`. Two pipelines:

  images  the built-in JPEG folder (`dataset: images`: PIL decode, RandomResizedCrop, flip,
          Normalize)
  shapes  examples/own-pipeline: WebDataset-format tar shards read as an IterableDataset, its own
          augmentation and a dict collate (2 shards: each of 2 workers reads one, and the window
          ends before it does)

The prediction starts from the one-core cells (2 workers, the most, are the curve's point; 1 worker
shows what a sample costs with fewer; 0 workers the rate without any) and predicts two workers on
two cores; the two-core cell measures it. Each cell's rate is read on free cores
(analysis.loader_scaling.loader_point: over the cores its mask offered it, monitor.cpu_offered), so
that other load on the machine, or a CPU hog on one core, moves both sides alike. Runs go repeat by
repeat, one-core and two-core cells interleaved, so that a burst of other load falls on both."""

from __future__ import annotations

import os
import sys

from feedbench.core.records import Record, record_of
from feedbench.harness import masked

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPES_SRC = os.path.join(ROOT, "examples", "own-pipeline", "src")

# The monitor at its default period: at 0.1 s its sampling (the workers' USS and PSS) took a fifth
# of a core in the cell's main process, a fifth of the one-core cells' core but a tenth of the
# two-core cell's (docs/harness.md).
COMMON = dict(
    scenario="loader",
    device="cpu",
    torch_threads=1,
    batch_size=16,
    warmup_steps=4,
    steps=80,
    monitor_interval_s=0.5,
)
PIPELINES = {
    "images": dict(dataset="images", image_size=224),
    "shapes": dict(
        dataset="shapes.data:build_dataset",
        collate="shapes.data:collate",
        python_path=[SHAPES_SRC],
        dataset_args={"count": 3072, "size": 256, "crop": 224, "shards": 2},
        # its samples cost less: twice the steps make a window as long as the JPEG folder's (1-2 s)
        steps=160,
    ),
}
# (workers, cores) of each cell: the one-core points the prediction uses, then the two-core cell it
# predicts.
ONE_CORE = ((0, 1), (1, 1), (2, 1))
TWO_CORES = ((2, 2),)
# The check (tests/analysis/test_loader_scaling.py, benchmarks/loader_scaling_error.py --check): the
# curve's one-core point and the two-core cell it predicts, 3 repeats each. 5 narrowed the
# run-to-run spread little (docs/results/ prediction-error-loader.md): the scatter is between runs,
# not between repeats.
CHECK_CELLS = ((2, 1), (2, 2))
CHECK_REPEATS = 3


def prepare(root: str) -> dict[str, dict]:
    """The pipelines' knobs with their data under `root`, made once and written back to disk before
    any cell runs (a cell measured while the kernel writes the new files back would share its cores
    with that)."""
    from feedbench.harness.images import make_images

    sys.path.insert(0, SHAPES_SRC)
    try:
        from shapes.data import make_shards
    finally:
        sys.path.remove(SHAPES_SRC)
    images = os.path.join(root, "images")
    if not os.path.isdir(images):
        make_images(images, count=1536, size=256, classes=8)
    knobs = {name: dict(knobs) for name, knobs in PIPELINES.items()}
    knobs["images"]["data_dir"] = images
    shapes = {**knobs["shapes"]["dataset_args"], "root": os.path.join(root, "shapes")}
    # the factory's
    make_shards(shapes["root"], shapes["shards"], shapes["count"], shapes["size"], classes=10)
    knobs["shapes"]["dataset_args"] = shapes
    os.sync()
    return knobs


def run_masked(knobs: dict, out: str, cores: int) -> dict:
    """One cell under an affinity mask of the `cores` quietest CPUs (feedbench.harness.masked),
    examples/own-pipeline importable."""
    return masked.run_masked(knobs, out, cores, (SHAPES_SRC,))


def measure(
    root: str, pipeline: str, repeats: int = 3, cells=ONE_CORE + TWO_CORES
) -> list[tuple[int, int, Record]]:
    """(workers, cores, the result's record: core.records) of each of `cells` ((workers, cores)
    pairs) of `pipeline`, `repeats` times, one-core and two-core cells in turn."""
    knobs = prepare(root)[pipeline]
    runs = []
    for repeat in range(1, repeats + 1):
        for workers, cores in cells:
            cell = f"{pipeline}-w{workers}-c{cores}"
            out = os.path.join(root, "cells", cell, f"rep{repeat}")
            cell_knobs = {
                **COMMON,
                **knobs,
                "num_workers": workers,
                "experiment": "loader-scaling",
                "cell": cell,
            }
            result = run_masked({**cell_knobs, "repeat": repeat}, out, cores)
            runs.append((workers, cores, record_of(result, os.path.join(out, "result.json"))))
    return runs
