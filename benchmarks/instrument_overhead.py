"""Does the instrument change what it measures? Instrumented vs bare training loop, side by side.

The bare loop is what a user would write: next(loader), .to(device), forward,
backward, step; no clocks, no monitor. The instrumented loop is feedbench's
harness with its phase clock and its monitor thread. Both use the same
dataset, loader, model and steps, and run alternately, so drift of a shared
machine hits both. The figure is instrumented / bare throughput (target >= 0.98).

    .venv/bin/python benchmarks/instrument_overhead.py [--rounds 5] [--steps N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import _checkout  # noqa: F401  (this checkout's feedbench, not the venv's: benchmarks/_checkout.py)
import torch
from feedbench.core.cell import parse_cell
from feedbench.harness.data import build_dataset, build_loader
from feedbench.harness.distributed import World, rank_device
from feedbench.harness.fit import resolve
from feedbench.harness.loop import Measurement, epoch_batches, measure
from feedbench.harness.models import build_model, loss_function
from feedbench.harness.monitor import Monitor
from feedbench.harness.prefetch import to_device

CONFIGS = {
    "resnet18 synthetic 64px b16": dict(
        model="resnet18",
        dataset="synthetic",
        image_size=64,
        num_classes=100,
        batch_size=16,
        steps=20,
        warmup_steps=3,
    ),
    "mlp memory 1024x4 b256": dict(
        model="mlp",
        dataset="memory",
        input_size=1024,
        width=1024,
        hidden_layers=4,
        batch_size=256,
        num_samples=8192,
        steps=60,
        warmup_steps=5,
    ),
}


def bare_loop(cell, device: torch.device) -> float:
    """samples/s of the plain loop a user would write."""
    torch.manual_seed(cell.seed)
    loader = build_loader(cell, build_dataset(cell))
    model = build_model(cell).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=cell.lr, momentum=cell.momentum)
    loss_fn = loss_function(cell.model)
    # the pulls it counts are the loop's bookkeeping, unread here
    batches = epoch_batches(loader, Measurement())

    def step():
        batch = to_device(next(batches), device, cell.non_blocking)
        loss = loss_fn(model(batch[0]), batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return len(batch[0])

    for _ in range(cell.warmup_steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    samples = sum(step() for _ in range(cell.steps))
    if device.type == "cuda":
        torch.cuda.synchronize()
    return samples / (time.perf_counter() - start)


def instrumented_loop(cell, device: torch.device) -> float:
    m = Measurement()
    measure(cell, device, m, monitor=Monitor(cell.monitor_interval_s, device))
    return sum(m.samples) / (m.window_end - m.step_starts[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--steps", type=int, help="measured steps of each loop (default: each config's own)"
    )
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} "
        "alternating rounds"
    )
    for name, knobs in CONFIGS.items():
        knobs = dict(knobs, device=args.device, **({"steps": args.steps} if args.steps else {}))
        cell, _ = resolve(parse_cell(knobs), torch.cuda.is_available())
        # a CUDA device with its index, as the harness runs it
        device = rank_device(cell.device, World())
        bare_loop(cell, device)  # one unmeasured round of each: caches, allocator, thread pools
        instrumented_loop(cell, device)
        ratios, bare, inst = [], [], []
        for _ in range(args.rounds):
            b = bare_loop(cell, device)
            i = instrumented_loop(cell, device)
            bare.append(b)
            inst.append(i)
            ratios.append(i / b)
        print(
            f"{name} on {device.type}: bare {statistics.median(bare):.1f} samples/s, "
            f"instrumented {statistics.median(inst):.1f} samples/s, ratio median "
            f"{statistics.median(ratios):.3f} (rounds: {', '.join(f'{r:.3f}' for r in ratios)})"
        )


if __name__ == "__main__":
    main()
