"""The trainer's threads, old default against new, beside the plain loop the user would run.

On examples/own-pipeline's objects (own_pipeline_overhead.py's: shards read as an IterableDataset, a
dict collate, a small CNN, its step), on the CPU, at 0 and 2 loader workers, three arms in
alternating order each round, one process:

    plain     the loop a user writes (own_pipeline_overhead.bare_loop) at PyTorch's default threads:
              `python train.py`
    old       feedbench.measure with torch_threads 1 (the default until #39: what torchrun gives a
              rank)
    new       feedbench.measure with torch_threads unset (the default now: what the launch gives,
              here PyTorch's)

Prints each arm's median samples/s and its ratio to the plain loop: the default that measures the
user's job is the one whose ratio is near 1, and whose answer to "do 2 workers help?" is the plain
loop's.

    PYTHONPATH=workflow .venv/bin/python benchmarks/threads_default.py [--rounds 5] [--steps 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import _checkout  # noqa: F401  (this checkout's feedbench, not the venv's: benchmarks/_checkout.py)
import feedbench
import torch
from feedbench.core.plugins import Context

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import own_pipeline_overhead as plain  # noqa: E402  (its bare loop and the example's objects)
from own_pipeline_overhead import data, models, train  # noqa: E402

DEFAULT_THREADS = torch.get_num_threads()  # PyTorch's own default here, before any arm sets its own


def arms(dataset, model, workers: int, steps: int) -> dict:
    """The three arms' samples/s callables at `workers` loader workers."""
    knobs = {**plain.KNOBS, "num_workers": workers, "steps": steps}
    knobs.pop("torch_threads")

    def plain_loop() -> float:
        plain.KNOBS.update(num_workers=workers, steps=steps)
        torch.set_num_threads(DEFAULT_THREADS)
        return plain.bare_loop(dataset, model, torch.device("cpu"))

    def feedbench_with(**threads) -> float:
        result = feedbench.measure(
            dataset=dataset,
            model=model,
            collate=data.collate,
            step=train.train_step,
            device="cpu",
            **knobs,
            **threads,
        )
        assert result["status"] == "ok", result["error"]
        return result["metrics"]["samples_per_s"]

    return {
        "plain": plain_loop,
        "old": lambda: feedbench_with(torch_threads=1),
        "new": feedbench_with,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, PyTorch's default threads here {DEFAULT_THREADS}, "
        f"{os.cpu_count()} CPUs; ",
        end="",
    )
    print(
        f"{args.rounds} rounds of {args.steps} steps; load average before {os.getloadavg()[0]:.2f}"
    )
    print(
        "| workers | plain loop, samples/s | old default (1 thread) | ratio | new default "
        "(the launch's) | ratio |"
    )
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        ctx = Context(0, 1, 0, torch.device("cpu"), plain.KNOBS["batch_size"], 0, 0)
        dataset = data.build_dataset(ctx, root=root, shards=4, count=512)
        model = models.build_model(ctx)
        for workers in (0, 2):
            run = arms(dataset, model, workers, args.steps)
            for arm in run.values():  # one unmeasured round of each: caches, allocator, page cache
                arm()
            got = {name: [] for name in run}
            for round_ in range(args.rounds):
                order = list(run)[round_ % 3 :] + list(run)[: round_ % 3]
                for name in order:
                    got[name].append(run[name]())
            median = {name: statistics.median(values) for name, values in got.items()}
            print(
                f"| {workers} | {median['plain']:.1f} | {median['old']:.1f} | "
                f"{median['old'] / median['plain']:.2f} | {median['new']:.1f} | "
                f"{median['new'] / median['plain']:.2f} |"
            )
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
