"""The transfer ceiling: host-to-device bandwidth by copy size, pinned vs pageable.

On a GPU each copy is timed by CUDA events around it; without an accelerator
the probe times a host memcpy of the same sizes, labelled as such.
"""

from __future__ import annotations

import statistics
import time

import torch

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
            timings = []
            for _ in range(cell.warmup_steps + cell.steps):
                check_stop()
                if device.type == "cuda":
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    dst.copy_(src, non_blocking=pinned)
                    end.record()
                    timings.append((start, end))
                else:
                    t0 = time.perf_counter()
                    dst.copy_(src)
                    timings.append(time.perf_counter() - t0)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            for rep, t in enumerate(timings[cell.warmup_steps :]):
                ms = t[0].elapsed_time(t[1]) if device.type == "cuda" else t * 1000
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
        "method": "cuda events around copy_" if device.type == "cuda" else "host memcpy (no accelerator)",
        "by_size": [],
    }
    for size in cell.transfer_sizes:
        for pinned in pinnings:
            rates = [r["gb_per_s"] for r in rows if r["size_bytes"] == size and r["pinned"] == pinned and r["gb_per_s"]]
            summary["by_size"].append(
                {"size_bytes": size, "pinned": pinned, "median_gb_per_s": statistics.median(rates) if rates else None}
            )
    for pinned in pinnings:
        rates = [s["median_gb_per_s"] for s in summary["by_size"] if s["pinned"] == pinned and s["median_gb_per_s"]]
        summary["peak_gb_per_s_" + ("pinned" if pinned else "pageable")] = max(rates) if rates else None
    return rows, summary
