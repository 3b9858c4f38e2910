"""Predict a training cell's throughput from its ceilings, and say what bounds it.

A training step has three parts that the ceilings measure one by one (docs/harness.md,
"The prediction model", says the same in prose):

    t_load  = 1 / L   L: the loader alone (scenario loader) at the cell's dataset, workers, batch and pinning
    t_comp  = 1 / C   C: compute with the data resident on the device (scenario compute), same model and batch
    t_copy  = batch bytes / (B x batch)   B: the transfer probe's GB/s at the size nearest the batch's bytes,
                                          pinned when the cell pins its batches, else pageable; 0 on a CPU.
              For the user's own pipeline (user_batch), whose bytes batch_bytes cannot know: the median ms of
              a real batch of theirs, timed by a transfer probe with the cell's USER_BATCH_KNOBS, over the batch

all per sample. The trainer's side of a step is t_gpu = max(t_comp, t_copy) when a side stream
prefetches the next batch (device_prefetch stream: the copy overlaps compute), else t_comp + t_copy
(the copy runs on the compute stream, in series; non_blocking alone overlaps nothing there, since the
next kernel waits for the copy). With loader workers the loader runs beside the trainer, so
t = max(t_load, t_gpu); without workers the main process loads, then trains: t = t_load + t_gpu.
The prediction is 1 / t samples/s and the bound is the largest term.

This module is torch- and pandas-free at import: feedbench.matrix derives ceiling cells with it while
the Snakefile parses.
"""

from __future__ import annotations

import math
from typing import Any

from .knobs import BUILTIN_DATASETS, KNOBS, dropped_by, kept_by
from .model_names import input_kind

# Which ceilings keep each knob is declared with it (feedbench.knobs.Knob.ceilings); these are derived from that.
# Knobs that only change how the loader delivers batches (and the copy knobs): a compute ceiling resets them.
LOADER_ONLY = dropped_by("compute")
# Knobs that only change the model's work per batch (and the copy knobs the loader alone never uses): a loader ceiling
# resets them. Not `model`, whose kind decides the shape of the samples the loader makes.
MODEL_ONLY = dropped_by("loader")
# Knobs no ceiling keeps: labels of the measurement, not of the work (and the copy knobs).
NEVER = tuple(name for name in LOADER_ONLY if name in MODEL_ONLY)
CEILINGS = ("loader", "compute")
# Bytes per element of a sample (float32) and of a label (int64), as feedbench.data makes them.
SAMPLE_BYTES, LABEL_BYTES = 4, 8


def ceiling_knobs(knobs: dict[str, Any], scenario: str) -> dict[str, Any]:
    """The knobs of the `scenario` ceiling (loader or compute) a training cell with `knobs` needs."""
    reset = LOADER_ONLY if scenario == "compute" else MODEL_ONLY
    derived = {k: v for k, v in knobs.items() if k not in reset and k not in NEVER}
    return {**derived, "scenario": scenario}


def batch_bytes(knobs: dict[str, Any]) -> int | None:
    """Bytes of one batch copied to the device: float32 samples plus int64 labels; None for tokens (variable)."""

    def get(name: str) -> Any:
        return knobs.get(name, KNOBS[name].default)

    model, dataset = get("model"), get("dataset")
    sample = BUILTIN_DATASETS[dataset].sample if dataset in BUILTIN_DATASETS else "model"
    if sample == "model":  # shaped for the model
        sample = input_kind(model)
    if sample == "tokens":
        return None
    features = get("input_size") if sample == "vector" else 3 * get("image_size") ** 2
    return int(get("batch_size")) * (int(features) * SAMPLE_BYTES + LABEL_BYTES)


# The knobs that make a user's batch and move it (feedbench.transfer.batch_probe): a training cell's transfer ceiling
# times a real batch of its own, so its probe has the same ones.
USER_BATCH_KNOBS = kept_by("transfer")


def user_probe_knobs(knobs: dict) -> dict:
    """The transfer probe that times a real batch of a training cell's own pipeline on its device."""
    own = {k: knobs[k] for k in USER_BATCH_KNOBS if k in knobs and knobs[k] != KNOBS[k].default}
    return {"scenario": "transfer", "device": knobs["device"], **own}


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
    gpu = max(terms["compute"], terms["transfer"]) if stream_prefetch else terms["compute"] + terms["transfer"]
    per_sample = terms["data"] + gpu if workers == 0 else max(terms["data"], gpu)
    bound = max(terms, key=terms.get)
    return 1 / per_sample, bound, {k: 1000 * v for k, v in terms.items()}
