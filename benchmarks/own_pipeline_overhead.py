"""The harness on the user's own pipeline vs the bare loop a user would write over the same objects.

The objects are examples/own-pipeline's: WebDataset-format shards read as an
IterableDataset with its own augmentation, a dict collate, a small CNN and a
custom step. The bare loop: DataLoader, move the dict to the device, step,
backward, optimizer step; no clocks, no monitor. The instrumented one is
feedbench.measure on the same objects (phase clock, monitor thread, the
default mover). Rounds alternate in one process, so drift of a shared machine
hits both. The figure is instrumented / bare samples/s (target >= 0.98).

    PYTHONPATH=workflow .venv/bin/python benchmarks/own_pipeline_overhead.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Callable

import _checkout  # noqa: F401  (this checkout's feedbench, not the venv's: benchmarks/_checkout.py)
import feedbench
import torch
from feedbench.core.plugins import Context
from torch.utils.data import DataLoader

sys.path.insert(
    0,
    os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "examples", "own-pipeline", "src"
    ),
)
from shapes import data, models, train  # noqa: E402  (the example project, outside the package)

KNOBS = dict(
    batch_size=16, num_workers=0, steps=30, warmup_steps=3, torch_threads=1, monitor_interval_s=0.5
)


def bare_loop(
    dataset, model, device: torch.device, mark: Callable[[], None] = lambda: None
) -> float:
    """samples/s of the loop a user would write over the same objects; `mark()` runs at the window's
    start and end."""
    loader = DataLoader(
        dataset,
        batch_size=KNOBS["batch_size"],
        num_workers=KNOBS["num_workers"],
        collate_fn=data.collate,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ctx = Context(
        0, 1, 0, device, KNOBS["batch_size"], KNOBS["num_workers"], 0, optimizer=optimizer
    )

    def batches():
        while True:
            yield from loader

    stream = batches()

    def step() -> int:
        batch = {k: v.to(device) for k, v in next(stream).items()}
        train.train_step(model, batch, ctx).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return len(batch["label"])

    for _ in range(KNOBS["warmup_steps"]):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    mark()
    start = time.perf_counter()
    samples = sum(step() for _ in range(KNOBS["steps"]))
    if device.type == "cuda":
        torch.cuda.synchronize()
    end = time.perf_counter()
    mark()
    return samples / (end - start)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=KNOBS["steps"])
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    KNOBS["steps"] = args.steps
    torch.set_num_threads(KNOBS["torch_threads"])
    device = torch.device(
        "cuda"
        if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        else "cpu"
    )
    with tempfile.TemporaryDirectory() as root:
        ctx = Context(0, 1, 0, device, KNOBS["batch_size"], 0, 0)
        dataset = data.build_dataset(ctx, root=root, shards=4, count=512)
        model = models.build_model(ctx).to(device)

        def instrumented() -> float:
            result = feedbench.measure(
                dataset=dataset,
                model=model,
                collate=data.collate,
                step=train.train_step,
                device=device.type,
                **KNOBS,
            )
            assert result["status"] == "ok", result["error"]
            return result["metrics"]["samples_per_s"]

        print(
            f"torch {torch.__version__}, {torch.get_num_threads()} thread, {device.type}, "
            f"{args.rounds} rounds of {KNOBS['steps']} steps, the first loop alternating; load "
            f"average before: {_load()}"
        )
        # one unmeasured round of each: caches, allocator, page cache
        bare_loop(dataset, model, device)
        instrumented()
        bare, inst = [], []
        for round_ in range(args.rounds):
            if round_ % 2:  # feedbench first
                inst.append(instrumented())
                bare.append(bare_loop(dataset, model, device))
            else:
                bare.append(bare_loop(dataset, model, device))
                inst.append(instrumented())
        ratios = [i / b for i, b in zip(inst, bare, strict=True)]
        print(
            f"shapes example: bare {statistics.median(bare):.1f} samples/s, feedbench "
            f"{statistics.median(inst):.1f} samples/s, ratio median "
            f"{statistics.median(ratios):.3f} (rounds, bare first in the 1st, 3rd, ...: "
            f"{', '.join(f'{r:.3f}' for r in ratios)}); load average after: {_load()}"
        )


if __name__ == "__main__":
    main()
