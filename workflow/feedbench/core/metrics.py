"""Metrics of a measured window, from per-step phase durations."""

from __future__ import annotations

import statistics

# The phases of a step, in the order of a step: the one list the harness, the summary, the plots and
# the views use. wait is the host blocked on the loader; device_prep the trainer's own device work
# while it fetched the batch (device_stages, torchvision-cuda: harness.timing.device_work), where it
# did some; h2d, fwd, bwd, opt are marked by the PhaseClock; gpu_idle is derived between steps
# (events mode), less the device_prep in that gap.
PHASES = ("wait", "device_prep", "h2d", "fwd", "bwd", "opt", "gpu_idle")
CLOCKED_PHASES = PHASES[2:6]


def median_of_known(values) -> float | None:
    """The median of the values that are known (not None), None when none is: a figure a cell may
    lack."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def stall_phase(steps: dict[str, list[float]]) -> str:
    """The phase that is the input stall: the GPU's idle time between steps where CUDA events read
    it, else the host's wait for data.

    With events the host runs ahead of the GPU: it waits for the next batch while the GPU still
    computes the last one, so its wait hides behind compute (on an H200, one worker and compute of
    90 % of the batch interval: the host waited 88 % of the step where the GPU idles 10 %). Under
    sync timing and on the CPU the two are the same time.
    """
    return "gpu_idle" if steps.get("gpu_idle") else "wait"


def summarize(
    steps: dict[str, list[float]],
    window_s: float,
    samples: int,
    tokens: int | None,
    h2d_bytes: int,
    prep_bytes: int = 0,
) -> dict:
    """steps: per-phase ms lists including 'step'; window_s: synchronised wall time of the
    window; h2d_bytes: what the steps copied to the device, `prep_bytes` of it inside device_prep
    (device_stages' copy), not in the h2d phase whose rate h2d_gb_per_s is."""
    step = steps["step"]
    total_step = sum(step)
    phases = {}
    for name, values in steps.items():
        if name == "step" or not values:
            continue
        phases[name] = {
            "median_ms": statistics.median(values),
            "mean_ms": statistics.fmean(values),
            "share": sum(values) / total_step if total_step else None,
        }
    h2d_ms = sum(steps.get("h2d", []))
    return {
        "steps": len(step),
        "samples": samples,
        "window_s": window_s,
        "samples_per_s": samples / window_s if window_s else None,
        "tokens_per_s": tokens / window_s if tokens is not None and window_s else None,
        "step_ms": {
            "median": statistics.median(step),
            "p10": _quantile(step, 0.1),
            "p90": _quantile(step, 0.9),
            "mean": statistics.fmean(step),
            "std": statistics.stdev(step) if len(step) > 1 else 0.0,
        },
        "phases": phases,
        "stall_pct": 100 * sum(steps.get(stall_phase(steps), [])) / total_step
        if total_step
        else None,
        "h2d_gb_per_s": (h2d_bytes - prep_bytes) / (h2d_ms / 1000) / 1e9
        if h2d_ms > 0 and h2d_bytes > prep_bytes
        else None,
        # what the measured steps of a training cell copied to the device, every tensor of each
        # batch (a target's copy is priced from it where the cell ran: docs/target.md, "The copy")
        "h2d_bytes": h2d_bytes,
    }


def wait_tail(waits_ms: list[float]) -> dict | None:
    """p50/p90/p99 of the data wait over the measured steps: the tail a mean hides (slow samples, GC
    pauses).

    Interpolated between ranks, so with fewer than 100 steps p99 lies between the two slowest waits.
    """
    if not waits_ms:
        return None
    return {f"p{q}": _quantile(waits_ms, q / 100) for q in (50, 90, 99)}


def epoch_boundaries(waits_ms: list[float], boundary_steps: list[int]) -> dict | None:
    """The wait of each measured step that began a later epoch (workers restart there unless
    persistent).

    excess_s: what those waits cost beyond the median wait, summed: the run's time lost at epoch
    boundaries.
    """
    stalls = [waits_ms[i] for i in boundary_steps if i < len(waits_ms)]
    if not stalls:
        return None
    median_wait = statistics.median(waits_ms)
    return {
        "count": len(stalls),
        "stalls_ms": stalls,
        "median_ms": statistics.median(stalls),
        "max_ms": max(stalls),
        "excess_s": sum(max(0.0, w - median_wait) for w in stalls) / 1000,
    }
