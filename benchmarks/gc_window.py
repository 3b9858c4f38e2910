"""Python's collector in the window, `gc: normal`, `freeze` and `disable` side by side: its default.

Two pipelines, the loader in the trainer's process (num_workers 0, where the collector's pauses fall
on the step), on the CPU, the three arms alternating in one process, each first in turn by round:

    text           examples/text-pipeline's objects: a pure-Python BPE tokenizer (its objects die
                   young), a padding collate, a named-input classifier
    annotations    a detection-style dataset: each sample a tensor and 40 box dicts, kept in the
                   batch (a list of dicts, as detection collates keep them), beside an index of 1.2
                   M live objects (a large heap, whose full collections are long)

Arms:

    normal   the collector as the job runs it (its collections in the window recorded)
    freeze   frozen before the warm-up (gc.freeze: the start-up heap is never scanned again), on
    disable  frozen before the warm-up, off from the window's start until it closes (timeit's rule)

Prints each arm's median samples/s (and each round's), its ratio to `normal`, and the collections
and pause milliseconds it recorded in the window.

    PYTHONPATH=workflow .venv/bin/python benchmarks/gc_window.py [--rounds 7] [--steps 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import _checkout  # noqa: F401  (this checkout's feedbench, not the venv's: benchmarks/_checkout.py)
import feedbench
import torch

MODES = ("normal", "freeze", "disable")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "text-pipeline")
sys.path.insert(0, os.path.join(EXAMPLE, "src"))
from reviews.data import ReviewShards, pad_collate  # noqa: E402  (the example's own code, as train.py uses it)
from reviews.model import ReviewClassifier  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402


class Annotations(Dataset):
    """A tensor and 40 box dicts a sample, over an index of `heap` live objects (file names, sizes,
    tags)."""

    def __init__(self, n: int = 4096, heap: int = 1_200_000):
        self.index = [{"file": f"{i:07d}.jpg", "tags": [i % 7]} for i in range(heap // 3)]
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        boxes = [{"box": [j, j, j + 4, j + 4], "label": j % 5} for j in range(40)]
        return torch.full((16,), float(i % 10)), boxes


def keep_boxes(samples):
    """Stacks the tensors, keeps the box dicts as they are: a detection collate."""
    return torch.stack([x for x, _ in samples]), [boxes for _, boxes in samples]


def box_step(model, batch, ctx):
    x, boxes = batch
    return model(x).pow(2).mean() + 0 * len(boxes)


def pipelines(steps: int) -> dict:
    """name -> (dataset, model, knobs) of the two pipelines."""
    common = dict(
        batch_size=32,
        steps=steps,
        warmup_steps=3,
        device="cpu",
        torch_threads=1,
        monitor_interval_s=5,
    )
    text = dict(
        collate=pad_collate,
        forward_keys=["input_ids", "attention_mask"],
        label_key="labels",
        optimizer="adamw",
        **common,
    )
    boxes = dict(collate=keep_boxes, step=box_step, **common)
    return {
        "text": (ReviewShards(os.path.join(EXAMPLE, "data")), ReviewClassifier(), text),
        "annotations": (Annotations(), nn.Linear(16, 1), boxes),
    }


def compare(dataset, model, knobs: dict, rounds: int) -> str:
    """The pipeline's markdown rows, the arms alternating by round."""

    def arm(mode: str) -> dict:
        result = feedbench.measure(dataset=dataset, model=model, gc=mode, **knobs)
        assert result["status"] == "ok", result["error"]
        return result["metrics"]

    for mode in MODES:  # one unmeasured round of each: caches, allocator
        arm(mode)
    got: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for round_ in range(rounds):
        for mode in MODES[round_ % 3 :] + MODES[: round_ % 3]:  # each arm first in turn
            got[mode].append(arm(mode))
    rate = {mode: statistics.median(m["samples_per_s"] for m in runs) for mode, runs in got.items()}
    lines = []
    for mode, runs in got.items():
        rounds_text = ", ".join(f"{m['samples_per_s']:.0f}" for m in runs)
        collections = statistics.median(m["gc"]["collections"] for m in runs)
        pauses = statistics.median(m["gc"]["pause_ms"] for m in runs)
        window_ms = statistics.median(1000 * m["window_s"] for m in runs)
        ratio = f"{rate[mode] / rate['normal']:.3f}"
        lines.append(
            f"| {mode} | {rate[mode]:.1f} ({rounds_text}) | {ratio} | {collections:g} | "
            f"{pauses:.2f} | {window_ms:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {args.rounds} rounds of {args.steps} steps; load "
        f"{os.getloadavg()[0]:.2f}"
    )
    print(
        "| pipeline | arm | samples/s, median (rounds) | / normal | collections in the window | "
        "pauses, ms | window, ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, (dataset, model, knobs) in pipelines(args.steps).items():
        rows = compare(dataset, model, knobs, args.rounds)
        print("\n".join(f"| {name} {row}" for row in rows.splitlines()))
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
