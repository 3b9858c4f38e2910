"""What stage timing costs: loader throughput with the knob stage_timing on beside off, in one
process.

Two pipelines: the built-in `images` dataset (JPEG files decoded by PIL, RandomResizedCrop, flip,
ToTensor, Normalize: read, decode and four transforms timed per sample) and examples/own-pipeline
(WebDataset-format shards read as an IterableDataset with its own augmentation and a dict collate:
each next() and the collate timed). Each round measures a loader cell (no model, no copy) with
timing on and one with it off, through feedbench.measure; which goes first alternates from round to
round, so drift of a shared machine hits both. The figure is on / off samples/s, the median over
rounds; the issue's bar is an overhead of at most 1 % (a ratio >= 0.99). On a loaded machine
wall-clock rounds spread by tens of percent, so the script also gives the ratio of the process's CPU
time per sample (time.process_time over the whole cell, set-up included; with 0 workers all loader
work is in this process), which a descheduled process does not inflate, and the best round of each
(the most samples/s, the least CPU per sample): what each does when the machine lets it.

    PYTHONPATH=workflow .venv/bin/python benchmarks/stage_timing_overhead.py [--rounds 15] [--workers 0]
"""  # noqa: E501

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import _checkout  # noqa: F401  (this checkout's feedbench, not the venv's: benchmarks/_checkout.py)
import feedbench
import torch
from feedbench.core.plugins import Context
from feedbench.harness.images import make_images

sys.path.insert(
    0,
    os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "examples", "own-pipeline", "src"
    ),
)
from shapes import data  # noqa: E402  (the example project, outside the package)

KNOBS = dict(scenario="loader", device="cpu", warmup_steps=3, torch_threads=1, monitor_interval_s=5)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def pipelines(root: str, steps: int, workers: int) -> dict[str, dict]:
    """The knobs of each pipeline's loader cell, on a fresh folder of images and of shards."""
    images = os.path.join(root, "images")
    make_images(images, count=512, size=256, classes=8)
    ctx = Context(0, 1, 0, torch.device("cpu"), 16, workers, 0)
    shapes = data.build_dataset(ctx, root=os.path.join(root, "shards"), shards=4, count=512)
    return {
        "images (512 JPEGs 256 px, crop 224, batch 32)": dict(
            dataset="images", data_dir=images, image_size=224, batch_size=32, steps=steps
        ),
        "own-pipeline (shapes, 512 JPEGs 64 px in 4 shards, crop 56, batch 16)": dict(
            dataset=shapes, collate=data.collate, batch_size=16, steps=steps * 2
        ),
    }


def throughput(knobs: dict, on: bool, workers: int) -> tuple[float, float]:
    """samples/s of the measured window, and the process's CPU ms per measured sample over the whole
    cell."""
    cpu = time.process_time()
    result = feedbench.measure(**KNOBS, **knobs, num_workers=workers, stage_timing=on)
    cpu = time.process_time() - cpu
    assert result["status"] == "ok", result["error"]
    assert (result["metrics"]["stages"] is not None) == on
    return result["metrics"]["samples_per_s"], cpu * 1000 / result["metrics"]["samples"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(KNOBS["torch_threads"])
    print(
        f"torch {torch.__version__}, 1 thread, cpu, {args.workers} workers, {args.rounds} "
        f"rounds, the first cell alternating; load average before: {_load()}"
    )
    with tempfile.TemporaryDirectory() as root:
        for name, knobs in pipelines(root, args.steps, args.workers).items():
            # one unmeasured pair: page cache, allocator, imports
            throughput(knobs, True, args.workers)
            throughput(knobs, False, args.workers)
            on, off = [], []
            for round_ in range(args.rounds):
                for timed in (True, False) if round_ % 2 else (False, True):
                    (on if timed else off).append(throughput(knobs, timed, args.workers))
            ratios = [a[0] / b[0] for a, b in zip(on, off, strict=True)]
            cpu = [a[1] / b[1] for a, b in zip(on, off, strict=True)]
            ratio = statistics.median(ratios)
            print(
                f"{name}: off {statistics.median(r[0] for r in off):.1f} samples/s, on "
                f"{statistics.median(r[0] for r in on):.1f} samples/s, ratio median {ratio:.3f} "
                f"(overhead {100 * (1 - ratio):.1f} %; rounds, off first in the 1st, 3rd, ...: "
                f"{', '.join(f'{r:.3f}' for r in ratios)}); CPU ms per sample off "
                f"{statistics.median(r[1] for r in off):.3f}, on "
                f"{statistics.median(r[1] for r in on):.3f}, ratio median "
                f"{statistics.median(cpu):.3f} ({', '.join(f'{r:.3f}' for r in cpu)}); best "
                f"rounds: samples/s on / off {max(r[0] for r in on) / max(r[0] for r in off):.3f}"
                f", CPU per sample on / off {min(r[1] for r in on) / min(r[1] for r in off):.3f}"
                f"; load average after: {_load()}",
                flush=True,
            )


if __name__ == "__main__":
    main()
