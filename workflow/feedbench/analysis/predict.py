"""Predict a training cell's throughput from its ceilings, and say what bounds it.

A training step has three parts that the ceilings measure one by one (docs/harness.md,
"The prediction model", says the same in prose):

    t_load  = 1 / L   L: the loader alone (scenario loader) at the cell's dataset, workers, batch and pinning
    t_comp  = 1 / C   C: compute with the data resident on the device (scenario compute), same model and batch
    t_copy  = batch bytes / (B x batch)   B: the transfer probe's GB/s at the size nearest the batch's bytes,
                                          pinned when the cell pins its batches, else pageable; 0 on a CPU.
              For the user's own pipeline (knobs.user_batch), whose bytes ceilings.batch_bytes cannot know: the
              median ms of a real batch of theirs, timed by a transfer probe of the cell's own batch, over the batch

all per sample. The trainer's side of a step is t_gpu = max(t_comp, t_copy) when a side stream
prefetches the next batch (device_prefetch stream: the copy overlaps compute), else t_comp + t_copy
(the copy runs on the compute stream, in series; non_blocking alone overlaps nothing there, since the
next kernel waits for the copy). With loader workers the loader runs beside the trainer, so
t = max(t_load, t_gpu); without workers the main process loads, then trains: t = t_load + t_gpu.
The prediction is 1 / t samples/s and the bound is the largest term. The trainer's side is
feedbench.plan.ceilings.trainer_seconds, which the estimate for a target GPU (feedbench.plan.estimate) shares.

Which cells measure the ceilings of which training cell, and the bytes of a batch, are feedbench.plan.ceilings'.
"""

from __future__ import annotations

import math

from ..plan.ceilings import trainer_seconds


def _finite(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def predict(
    loader_rate,
    compute_rate,
    workers: int,
    batch: int,
    copy_bytes=None,
    copy_gb_per_s=None,
    stream_prefetch: bool = False,
) -> tuple[float | None, str | None, dict]:
    """(samples/s, bound, per-sample ms of each term) from the ceilings; (None, None, ...) without both rates.

    The copy term is left out (0) when the batch's bytes or the bandwidth is unknown (a CPU cell copies nothing).
    """
    loader_rate, compute_rate = _finite(loader_rate), _finite(compute_rate)
    if loader_rate is None or compute_rate is None:
        return None, None, {}
    bandwidth, size = _finite(copy_gb_per_s), _finite(copy_bytes)
    terms = {
        "data": 1 / loader_rate,
        "compute": 1 / compute_rate,
        "transfer": size / (bandwidth * 1e9) / batch if bandwidth and size else 0.0,
    }
    gpu = trainer_seconds(terms["compute"], terms["transfer"], stream_prefetch)
    per_sample = terms["data"] + gpu if workers == 0 else max(terms["data"], gpu)
    bound = max(terms, key=terms.get)
    return 1 / per_sample, bound, {k: 1000 * v for k, v in terms.items()}
