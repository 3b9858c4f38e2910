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
(the copy runs on the compute stream, in series; non_blocking alone overlaps nothing there, since
the next kernel waits for the copy). With loader workers the loader runs beside the trainer, so t =
max(t_load, t_gpu); without workers the main process loads, then trains: t = t_load + t_gpu. The
prediction is 1 / t samples/s and the bound is the largest term. The trainer's side is
feedbench.core.ceilings.trainer_seconds, which the estimate for a target GPU
(feedbench.core.estimate) shares.

Which cells measure the ceilings of which training cell, and the bytes of a batch, are
feedbench.core.ceilings'.
"""  # noqa: E501

from __future__ import annotations

import math

from ..core.ceilings import trainer_seconds


def positive(value) -> float | None:
    """A finite number above zero, else None: a rate or a size the models can divide by."""
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
    """(samples/s, bound, per-sample ms of each term) from the ceilings; (None, None, ...) without
    both rates.

    The copy term is left out (0) when the batch's bytes or the bandwidth is unknown (a CPU cell
    copies nothing).
    """
    loader_rate, compute_rate = positive(loader_rate), positive(compute_rate)
    if loader_rate is None or compute_rate is None:
        return None, None, {}
    bandwidth, size = positive(copy_gb_per_s), positive(copy_bytes)
    terms = {
        "data": 1 / loader_rate,
        "compute": 1 / compute_rate,
        "transfer": size / (bandwidth * 1e9) / batch if bandwidth and size else 0.0,
    }
    gpu = trainer_seconds(terms["compute"], terms["transfer"], stream_prefetch)
    per_sample = terms["data"] + gpu if workers == 0 else max(terms["data"], gpu)
    bound = max(terms, key=terms.get)
    return 1 / per_sample, bound, {k: 1000 * v for k, v in terms.items()}


# Stage what-ifs (knobs cache_after, skip_stages, device_stages; docs/harness.md, "Stage what-ifs"),
# from a cell's stage profile: W its worker's ms per sample, s the ms per sample of the stages the
# what-if takes out of the workers.
#     loader ceiling  L' = L x W / (W - s)     the loader is as fast as its workers make samples
#     device stages   t_comp' = t_comp + d     d: their ms per sample on the device, in the training process  # noqa: E501
#                     bytes' = bytes / 4       when they make float32 of uint8 (TO_FLOAT): the batch crosses as uint8  # noqa: E501
# then predict() as for any cell. Stages outside the dataset's Compose (spans, the unattributed
# rest, collate) stay.
TO_FLOAT = ("ToTensor", "ConvertImageDtype", "ToDtype")


def taken_out(order: list[str], kind: str, stage, functions: list[str] = ()) -> list[str]:
    """The stages a what-if takes out of the workers: those skipped, the cached ones (up to and
    including the stage, in the pipeline's order; a @feedbench.stage function of `functions`,
    alone), or those from the stage on (device_stages). A stage outside `order` takes out
    nothing."""
    if kind == "skip_stages":
        return [stage] if isinstance(stage, str) else list(stage)
    if kind == "cache_after" and stage in functions:
        return [stage]
    if stage not in order:
        return []
    at = order.index(stage)
    return order[: at + 1] if kind == "cache_after" else order[at:]


def predict_whatif(
    rates: tuple,
    workers: int,
    batch: int,
    worker_ms: float,
    saved_ms: float,
    device_ms: float = 0.0,
    copy: tuple = (None, None),
    stream_prefetch: bool = False,
) -> tuple[float | None, str | None, dict]:
    """predict() of a stage what-if: `rates` (loader, compute samples/s) of the cell it changes, its
    worker's ms per sample, the ms per sample the what-if takes out, what the moved stages cost per
    sample on the device, and `copy` (bytes of a batch as it then crosses, GB/s). Also the loader
    ceiling it then has, in the terms (`loader_per_s`)."""
    loader, compute = positive(rates[0]), positive(rates[1])
    worker_ms = positive(worker_ms)
    if loader is None or compute is None or worker_ms is None:
        return None, None, {}
    # a loader that makes nothing is not infinitely fast
    left = max(worker_ms - max(saved_ms, 0.0), 1e-3 * worker_ms)
    loader = loader * worker_ms / left
    compute = 1 / (1 / compute + max(device_ms, 0.0) / 1000)
    predicted, bound, terms = predict(
        loader, compute, workers, batch, copy[0], copy[1], stream_prefetch
    )
    return predicted, bound, {**terms, "loader_per_s": loader}


def crossing_bytes(batch_bytes, moved: list[str]):
    """The bytes of a batch that crosses to the device before the moved stages: a quarter where one
    of them makes float32 of uint8 (TO_FLOAT), else the same."""
    size = positive(batch_bytes)
    if size is None:
        return None
    return size / 4 if any(name.split("#")[0] in TO_FLOAT for name in moved) else size
