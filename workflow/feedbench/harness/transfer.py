"""The transfer ceiling: host-to-device bandwidth by copy size, pinned vs pageable.

On a GPU each copy is timed by CUDA events around it; without an accelerator
the probe times a host memcpy of the same sizes, labelled as such. A cell with
the user's own dataset or collate also times a real batch of theirs, moved by
their to_device (batch_probe): nested dicts, dataclasses and custom movers are
then what is timed, beside one flat tensor of the same bytes.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from functools import partial
from typing import Callable

import torch

from .batches import batch_bytes, batch_tensors, unpinned_note
from .stop import check_stop


def probe(cell, device: torch.device) -> tuple[list[dict], dict]:
    """Return one row per timed copy and the summary (median GB/s per size and pinning)."""
    rows: list[dict] = []
    pinnings = (False, True) if device.type == "cuda" else (False,)
    for size in cell.transfer_sizes:
        for pinned in pinnings:
            src = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
            src.fill_(1)
            dst = torch.empty(size, dtype=torch.uint8, device=device)
            for rep, ms in enumerate(
                _timed(cell, device, partial(dst.copy_, src, non_blocking=pinned))
            ):
                rows.append(
                    {
                        "size_bytes": size,
                        "pinned": pinned,
                        "rep": rep,
                        "ms": ms,
                        "gb_per_s": size / (ms / 1000) / 1e9 if ms > 0 else None,
                    }
                )
            del src, dst
    summary = {
        "method": "cuda events around copy_"
        if device.type == "cuda"
        else "host memcpy (no accelerator)",
        "by_size": [],
    }
    for size in cell.transfer_sizes:
        for pinned in pinnings:
            rates = [
                r["gb_per_s"]
                for r in rows
                if r["size_bytes"] == size and r["pinned"] == pinned and r["gb_per_s"]
            ]
            summary["by_size"].append(
                {
                    "size_bytes": size,
                    "pinned": pinned,
                    "median_gb_per_s": statistics.median(rates) if rates else None,
                }
            )
    for pinned in pinnings:
        rates = [
            s["median_gb_per_s"]
            for s in summary["by_size"]
            if s["pinned"] == pinned and s["median_gb_per_s"]
        ]
        summary["peak_gb_per_s_" + ("pinned" if pinned else "pageable")] = (
            max(rates) if rates else None
        )
    return rows, summary


def batch_probe(
    cell, device: torch.device, first_batch: Callable, move: Callable, names: dict[str, str]
) -> tuple[list[dict], dict, list[str]]:
    """Time a real batch of the user's moved by their to_device: pageable and, on a GPU, pinned as
    their DataLoader pins it; beside it one flat tensor of the same bytes, so the cost of the
    batch's structure shows.

    `first_batch(pinned)` is the loader's first batch with pin_memory=pinned; `names` the cell's
    import paths by knob. Returns the rows, the summary (metrics.transfer.user_batch) and the
    adjustments (what was copied; a pinned batch that came back unpinned). On CPU the move copies
    nothing: the times are the mover's own, with no GB/s.
    """
    rows: list[dict] = []
    notes: list[str] = []
    by_pinning = []
    batches = {
        pinned: first_batch(pinned)
        for pinned in ((False, True) if device.type == "cuda" else (False,))
    }
    for pinned, batch in batches.items():
        size = batch_bytes(batch)
        if pinned and unpinned_note(batch):
            notes.append(unpinned_note(batch))
        flat = torch.ones(size, dtype=torch.uint8, pin_memory=pinned)
        entry = {"pinned": pinned, "bytes": size}
        copies = {
            "batch": partial(move, batch, device, pinned),
            "flat": partial(flat.to, device, non_blocking=pinned),
        }
        for what, copy in copies.items():
            times = _timed(cell, device, copy)
            rows += [
                {
                    "copy": what,
                    "size_bytes": size,
                    "pinned": pinned,
                    "rep": rep,
                    "ms": ms,
                    "gb_per_s": _rate(size, ms, device),
                }
                for rep, ms in enumerate(times)
            ]
            entry[f"{what}_median_ms"] = statistics.median(times)
            entry[f"{what}_median_gb_per_s"] = _rate(size, entry[f"{what}_median_ms"], device)
        by_pinning.append(entry)
    summary = {
        "method": "cuda events around to_device"
        if device.type == "cuda"
        else "to_device on cpu (no copy: the mover's own time)",
        "structure": structure(batches[False]),
        "to_device": names.get("to_device", "feedbench.harness.batches:move_batch"),
        "by_pinning": by_pinning,
    }
    origin = f"dataset {cell.dataset}" + (
        f" and collate {names['collate']}" if "collate" in names else ""
    )
    pinnings = "pageable and pinned" if device.type == "cuda" else "pageable"
    notes.insert(
        0,
        f"transfer: also timed a real batch ({summary['structure']}, {by_pinning[0]['bytes']} "
        f"bytes, from {origin}) moved by {summary['to_device']}, {pinnings}, beside one flat "
        "tensor of the same bytes",
    )
    return rows, summary, notes


def _timed(cell, device: torch.device, copy: Callable) -> list[float]:
    """ms of each measured copy (after warmup_steps): CUDA events around it on a GPU, the host clock
    elsewhere."""
    timings = []
    for _ in range(cell.warmup_steps + cell.steps):
        check_stop()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            copy()
            end.record()
            timings.append((start, end))
        else:
            t0 = time.perf_counter()
            copy()
            timings.append(time.perf_counter() - t0)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) for start, end in timings[cell.warmup_steps :]]
    return [t * 1000 for t in timings[cell.warmup_steps :]]


def _rate(size: int, ms: float, device: torch.device) -> float | None:
    """GB/s of a copy where there is one: not on CPU (the batch is in place), not for a batch hiding
    its tensors."""
    return size / (ms / 1000) / 1e9 if size and device.type != "cpu" and ms > 0 else None


def structure(batch) -> str:
    """A batch's make-up in a few words: 'dict of 2 tensors', 'Batch (dataclass) of 3 tensors'."""
    kind = type(batch).__name__ + (" (dataclass)" if dataclasses.is_dataclass(batch) else "")
    count = len(batch_tensors(batch))
    return f"{kind} of {count} tensor{'' if count == 1 else 's'}"
