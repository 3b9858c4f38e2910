"""The compute estimate for a target GPU, its range, and its error against the published studies'
GPU throughputs.

A target's estimate (compute_seconds with `per_op`) prices each counted operation of the step on
its own, at what the GPU achieves in that operation's math path by public kernel-level measurements
(core.kernels, core/kernels.yaml: each figure with its source and shapes), memory-bound operations
at the memory's achieved bandwidth; the step takes that sum or the host's time to issue its kernels
(host_seconds), the longer, and is host-bound where the host's time is near the GPU's (host_bound).
Nothing in it is fitted to a model's throughput: the published throughputs are its check.

Its range (compute_range) is the factor by which it missed the published one-GPU cells of the
studies (report/references/, docs/studies.md), each counted on the model of the study's preset
(config/presets/), so the work counted is the work feedbench would run:

    scaling   ResNet-50 on K80s, samples/s per row of GPUs (data already on the GPU)
    nmt       a 4 x 512 LSTM on P100s, seconds of 20 batches per row
    prefetch  a 4096-wide MLP on an RTX 2080 Ti, seconds of epochs x 50 batches per row, copies from
              pageable memory

The family estimate (compute_seconds without `per_op`), kept beside it for comparison, is the step's
roofline (feedbench.core.target.roofline_seconds) over an efficiency of its model family fitted to
those studies: the geometric mean over a family's studies of each study's geometric mean of roofline
/ observed compute time, from its one-GPU rows; a family no study fits takes the pooled efficiency,
the geometric mean of all studies'. Its error is published leave one study out
(leave_one_study_out): each study predicted by efficiencies fitted to the others.
docs/results/prediction-error.md holds both, and the estimate against public single-GPU training
results, written by benchmarks/prediction_error.py; tests/core/test_estimate.py checks they agree.

Plain Python: the FLOPs and bytes come from a `count(knobs)` the caller passes
(feedbench.harness.flops.count_step).
"""

from __future__ import annotations

import csv
import math
import os
import statistics
from dataclasses import dataclass
from typing import Callable

import yaml

from .ceilings import batch_bytes, trainer_seconds
from .kernels import kernel_seconds
from .model_names import model_family
from .target import Gpu, Target, copy_seconds, dtype, find_gpu, pinned, roofline_seconds

# Seconds of the host's time per counted kernel of an eager PyTorch step (Python, the dispatcher,
# autograd, the launch): our own H200 ran a ResNet-18 of 64 px at batch 64 at 7215 samples/s, 8.87
# ms a step, where the GPU's work is a tenth of that and the count gives 164 kernels
# (docs/results/gpu-validation.md, sync timing, 2026-11-26,
# tests/harness/test_gpu.py::test_events_and_sync_agree_on_phase_times): 54 us each. Public
# figures are lower for the launch alone ("usually, the launch time on the CPU side is between 5-20
# microseconds": Meta's Holistic Trace Analysis, "CUDA Kernel Launch Statistics",
# https://github.com/facebookresearch/HolisticTraceAnalysis/blob/main/docs/source/features/cuda_kernel_launch_stats.rst);
# ours is a whole eager step's per kernel, on a cloud host's CPU. The step takes the longer of the
# host's time and the GPU's (compute_seconds).
HOST_SECONDS = 54e-6
# That H200 step: its knobs (the count gives its kernels) and its measured seconds.
HOST_SOURCE = {
    "knobs": {"model": "resnet18", "image_size": 64, "num_classes": 100, "batch_size": 64},
    "step_s": 64 / 7215,
}
# A cell whose host time is at least this share of its estimate is host-bound: the GPU waits on the
# host, whose time per kernel varies with the CPU, so its range is open above (estimate_range).
HOST_BOUND_SHARE = 0.5


def host_seconds(work) -> float:
    """The host's time to issue the step's counted kernels (HOST_SECONDS each)."""
    return work.kernels * HOST_SECONDS


def host_bound(work, seconds: float) -> bool:
    """Whether the host's time is at least HOST_BOUND_SHARE of a step estimated at `seconds`."""
    return host_seconds(work) >= HOST_BOUND_SHARE * seconds


# The bound every published cell had, by study, and the published evidence for it.
PUBLISHED_BOUND = {
    "scaling": (
        "compute",
        "the images are generated on the GPU before the loop: no data to wait for",
    ),
    "nmt": (
        "compute",
        "the fused kernel trains 1.3x faster than the step-by-step loop on the same data, and "
        "synthetic and WMT14 data train within 3 % of each other on one GPU: the model's kernels "
        "set the pace",
    ),
    "prefetch": (
        "compute",
        "the time grows by about 1.5 s per epoch with each square layer at a fixed batch, while "
        "hiding the copy behind compute saves 3 to 8 %",
    ),
}
# The GPU of each study, as its published table's hardware column names it.
STUDY_GPUS = {
    "scaling": ("K80", "K80"),
    "nmt": ("P100", "P100"),
    "prefetch": ("RTX2080Ti", "2080 Ti"),
}
# nmt.csv: seconds are the total of this many timed batches (its comment).
NMT_TIMED_BATCHES = 20


@dataclass(frozen=True)
class PublishedCell:
    study: str
    label: str  # the row, in a few words
    gpu: Gpu
    gpus: int
    knobs: dict  # the preset's full-size knobs for the row: what is counted
    published_step_s: float  # seconds of one step of one GPU, from the published number
    # of a batch copied to the GPU in the step (0: the data is on the GPU or negligible)
    copy_bytes: float
    overlapped: bool  # the copy is hidden behind compute (a side stream prefetches)
    unit: str  # of the published figure: "samples/s" (a rate) or "s" (the time of a run)
    per_step: float  # samples per step of all GPUs (a rate), or steps in the timed run (a time)

    def in_unit(self, step_s: float) -> float:
        """A step's seconds as the study published its figure: samples/s of all its GPUs, or seconds
        of its run."""
        return self.per_step / step_s if self.unit == "samples/s" else step_s * self.per_step

    @property
    def published(self) -> float:
        return self.in_unit(self.published_step_s)


def _preset_knobs(presets_dir: str, study: str) -> dict:
    with open(os.path.join(presets_dir, f"{study}.yaml"), encoding="utf-8") as f:
        preset = yaml.safe_load(f)
    defaults = {k: v for k, v in (preset.get("defaults") or {}).items() if k != "repeats"}
    return {**defaults, **preset["experiments"][study]["base"]}


def _rows(references_dir: str, study: str) -> list[dict]:
    with open(os.path.join(references_dir, f"{study}.csv"), encoding="utf-8") as f:
        lines = [line for line in f if not line.startswith("#")]
    rows = list(csv.DictReader(lines))
    name, printed = STUDY_GPUS[study]
    for row in rows:
        if printed not in row["hardware"]:
            raise ValueError(
                f"{study}.csv: hardware {row['hardware']!r} is not the {name} the estimate assumes"
            )
    return rows


def _cell(
    study: str, row: dict, knobs: dict, step_s: float, label: str, unit: tuple[str, float]
) -> PublishedCell:
    copy = batch_bytes(knobs) if knobs.get("scenario") == "train" else 0
    overlapped = knobs.get("device_prefetch") == "stream"
    gpus = int(row.get("gpus") or 1)
    gpu = find_gpu(STUDY_GPUS[study][0])
    return PublishedCell(study, label, gpu, gpus, knobs, step_s, copy or 0, overlapped, *unit)


def _gpus(count: int) -> str:
    return f"{count} GPU" + ("s" if count > 1 else "")


def published_cells(presets_dir: str, references_dir: str) -> list[PublishedCell]:
    """One PublishedCell per published GPU throughput of the scaling, nmt and prefetch studies, in
    table order."""
    cells = []
    base = _preset_knobs(presets_dir, "scaling")
    for row in _rows(references_dir, "scaling"):
        gpus = int(row["gpus"])
        step = base["batch_size"] * gpus / float(row["samples_per_s"])
        label = f"{_gpus(gpus)}, {row['parallel']}"
        cells.append(
            _cell("scaling", row, base, step, label, ("samples/s", base["batch_size"] * gpus))
        )
    base = _preset_knobs(presets_dir, "nmt")
    for row in _rows(references_dir, "nmt"):
        knobs = {**base, "lstm_impl": row["lstm_impl"], "batch_size": int(row["batch_size"])}
        label = f"{row['variant']}, {_gpus(int(row['gpus']))}, warm-up {row['warmup_steps']}"
        step = float(row["seconds"]) / NMT_TIMED_BATCHES
        cells.append(_cell("nmt", row, knobs, step, label, ("s", NMT_TIMED_BATCHES)))
    base = _preset_knobs(presets_dir, "prefetch")
    per_epoch = base["num_samples"] // base["batch_size"]
    for row in _rows(references_dir, "prefetch"):
        knobs = {
            **base,
            "hidden_layers": int(row["hidden_layers"]),
            "device_prefetch": row["device_prefetch"],
        }
        knobs["pin_memory"] = False  # the study's source is pageable
        steps = int(row["epochs"]) * per_epoch
        label = (
            f"{row['hidden_layers']} layers, {row['epochs']} epochs, prefetch "
            f"{row['device_prefetch']}"
        )
        cells.append(
            _cell("prefetch", row, knobs, float(row["seconds"]) / steps, label, ("s", steps))
        )
    return cells


def roofline(cell: PublishedCell, count: Callable) -> float:
    """The cell's roofline seconds on its study's GPU."""
    work = count(cell.knobs)
    return roofline_seconds(work.flops, work.bytes, cell.gpu, dtype(cell.knobs, cell.gpu))


def _target(cell: PublishedCell) -> Target:
    return Target(cell.gpu, cores_per_gpu=2, cpu_speed=1.0, link_gb_per_s=cell.gpu.h2d_gb_per_s)


def _geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def fit_efficiencies(cells: list[PublishedCell], count: Callable) -> dict[str, float]:
    """The family estimate's efficiency per family, and "pooled" over all studies, from the one-GPU
    cells (module docstring)."""
    by_study: dict[tuple[str, str], list[float]] = {}
    for cell in cells:
        if cell.gpus != 1:
            continue
        copy = copy_seconds(cell.copy_bytes, _target(cell), pinned(cell.knobs))
        observed = cell.published_step_s if cell.overlapped else cell.published_step_s - copy
        work = count(cell.knobs)
        if observed <= 0:
            continue
        by_study.setdefault((work.family, cell.study), []).append(
            roofline_seconds(work.flops, work.bytes, cell.gpu, dtype(cell.knobs, cell.gpu))
            / observed
        )
    studies = {key: _geomean(values) for key, values in by_study.items()}
    fitted = {}
    for family in sorted({family for family, _ in studies}):
        fitted[family] = _geomean([v for (f, _), v in studies.items() if f == family])
    if studies:
        fitted["pooled"] = _geomean(list(studies.values()))
    return fitted


@dataclass(frozen=True)
class Prediction:
    cell: PublishedCell
    efficiency: float  # the family's efficiency, or the share of the roofline the kernels reach
    efficiency_from: str  # the family's own fit, "pooled", or "kernels" (core.kernels)
    compute_s: float
    copy_s: float
    step_s: float
    bound: str  # compute or data (the copy: the published cells have no loader figure)
    error: float  # |predicted - published| / published samples/s
    host_bound: bool = False  # the host's time is at least half the compute (host_bound)

    @property
    def bound_right(self) -> bool:
        return self.bound == PUBLISHED_BOUND[self.cell.study][0]

    @property
    def ratio(self) -> float:
        """The published step over the predicted one: above 1, the prediction was too fast."""
        return self.cell.published_step_s / self.step_s

    @property
    def factor(self) -> float:
        """How far off, as a factor >= 1 whichever way (exp |ln predicted / published|): |predicted
        / published - 1| caps a prediction too slow at 100 % however slow, where a factor does not
        (2.3x too slow is 57 %)."""
        return max(self.ratio, 1 / self.ratio)

    @property
    def too_fast(self) -> bool:
        """Predicted faster than published (the loader then looks like the limit too soon)."""
        return self.step_s < self.cell.published_step_s


def compute_seconds(
    work, knobs: dict, gpu: Gpu, efficiencies: dict[str, float], per_op: bool = False
) -> tuple[float, str]:
    """A step's estimated compute seconds on `gpu` from its counted `work` (flops, bytes, kernels,
    family, operations: what feedbench.harness.flops.count_step gives), and what priced it.

    `per_op` (a target's estimate): each counted operation at its GPU's public kernel figure, or the
    memory-bound ones at the achieved bandwidth (core.kernels.kernel_seconds), summed: "kernels".
    Else the family estimate: the roofline over the family's efficiency (its own, else "pooled").
    Either way the host's time to issue the kernels (host_seconds) when it is longer: the larger of
    the two, not their sum, since CUDA launches are asynchronous (the host queues the next kernels
    while the GPU runs the earlier ones, and a step waits on the slower of the two queues). A cell
    where the host's time is near the GPU's is host-bound (host_bound) and its range says so.
    """
    if per_op:
        return max(sum(kernel_seconds(work, knobs, gpu).values()), host_seconds(work)), "kernels"
    source = work.family if work.family in efficiencies else "pooled"
    roofline = roofline_seconds(work.flops, work.bytes, gpu, dtype(knobs, gpu))
    return max(roofline / efficiencies[source], host_seconds(work)), source


def step_on(
    cell: PublishedCell,
    target: Target,
    efficiencies: dict[str, float],
    count: Callable,
    per_op: bool = False,
) -> tuple[float, float, float, str]:
    """(compute, copy, step seconds, what priced it) of the cell's step on `target`'s GPU and link:
    compute and copy, overlapped as its knobs say."""
    compute, source = compute_seconds(
        count(cell.knobs), cell.knobs, target.gpu, efficiencies, per_op
    )
    copy = copy_seconds(cell.copy_bytes, target, pinned(cell.knobs))
    return compute, copy, trainer_seconds(compute, copy, cell.overlapped), source


def predict(
    cell: PublishedCell, efficiencies: dict[str, float], count: Callable, per_op: bool = False
) -> Prediction:
    """The cell's step on its own study's GPU, by the family estimate with the given efficiencies or
    by the kernels (`per_op`), against the published figure."""
    compute, copy, step, source = step_on(cell, _target(cell), efficiencies, count, per_op)
    error = abs(cell.published_step_s / step - 1)
    bound = "compute" if compute >= copy else "data"
    work = count(cell.knobs)
    efficiency = efficiencies.get(source) or (
        roofline_seconds(work.flops, work.bytes, cell.gpu, dtype(cell.knobs, cell.gpu)) / compute
    )
    return Prediction(
        cell, efficiency, source, compute, copy, step, bound, error, host_bound(work, compute)
    )


def leave_one_study_out(
    cells: list[PublishedCell], count: Callable, per_op: bool = False
) -> list[Prediction]:
    """Every published cell predicted with efficiencies fitted to the other studies alone; by the
    kernels (`per_op`), fitted to none of them: each cell is held out as it is."""
    if per_op:
        return [predict(c, {}, count, per_op=True) for c in cells]
    predictions = []
    for study in dict.fromkeys(c.study for c in cells):
        fitted = fit_efficiencies([c for c in cells if c.study != study], count)
        predictions += [predict(c, fitted, count) for c in cells if c.study == study]
    return predictions


@dataclass(frozen=True)
class Summary:
    cells: int
    median_error: float
    worst_error: float
    bounds_right: float  # share of cells whose bound was called right
    median_factor: float  # the same errors as factors >= 1 whichever way (Prediction.factor)
    worst_factor: float
    worst_too_fast: bool  # which way the worst factor is off


def summarize(predictions: list[Prediction]) -> Summary:
    errors = [p.error for p in predictions]
    right = sum(p.bound_right for p in predictions) / len(predictions)
    worst = max(predictions, key=lambda p: p.factor)
    median_factor = statistics.median(p.factor for p in predictions)
    return Summary(
        len(predictions),
        statistics.median(errors),
        max(errors),
        right,
        median_factor,
        worst.factor,
        worst.too_fast,
    )


def error_groups(predictions: list[Prediction]) -> dict[str, list[Prediction]]:
    """The cells of each line of the summary: all, one GPU and several apart (the estimate models
    one GPU's step; the published multi-GPU rows add communication it does not model), then each
    study."""
    groups = {
        "all studies": predictions,
        "one-GPU cells": [p for p in predictions if p.cell.gpus == 1],
        "multi-GPU cells": [p for p in predictions if p.cell.gpus > 1],
    }
    for study in dict.fromkeys(p.cell.study for p in predictions):
        groups[study] = [p for p in predictions if p.cell.study == study]
    return {name: group for name, group in groups.items() if group}


def summary_table(predictions: list[Prediction]) -> list[str]:
    """The published summary (docs/results/prediction-error.md) as markdown rows: all cells, one-GPU
    and multi-GPU cells, each study, and the median across the studies (79 of the cells are one
    study's: the cells' median is mostly that study's). Each error also as a factor, the way it
    hurts: a percentage caps a too-slow prediction."""
    lines = [
        "| held-out cells | cells | median error | median factor | worst error | worst factor | "
        "bound called right |",
        "|---|---|---|---|---|---|---|",
    ]
    studies = []
    for name, group in error_groups(predictions).items():
        s = summarize(group)
        if name not in ("all studies", "one-GPU cells", "multi-GPU cells"):
            studies.append(s)
        way = "too fast" if s.worst_too_fast else "too slow"
        lines.append(
            f"| {name} | {s.cells} | {100 * s.median_error:.1f} % | {s.median_factor:.2f}x | "
            f"{100 * s.worst_error:.1f} % | {s.worst_factor:.2f}x {way} | "
            f"{100 * s.bounds_right:.0f} % |"
        )
    lines.append(
        f"| median across the {len(studies)} studies | | "
        f"{100 * statistics.median(s.median_error for s in studies):.1f} % "
        f"| {statistics.median(s.median_factor for s in studies):.2f}x | | | |"
    )
    return lines


def beside_published(
    predictions: list[Prediction],
    target: Target,
    efficiencies: dict[str, float],
    count: Callable,
    per_op=False,
) -> dict[str, dict]:
    """Per study: each published cell, its figure, the held-out prediction on the study's own GPU
    (what `predictions`, leave_one_study_out, gives: never fitted to the figure it is compared with)
    and its error, and the same protocol predicted on `target` with `efficiencies` (None where the
    target's GPU is the study's), by the per-operation estimate where `per_op`, as the predictions
    were. For the study views of a run with a `target:` (the report puts predicted beside
    published)."""
    studies: dict[str, dict] = {}
    for p in predictions:
        cell = p.cell
        study = studies.setdefault(
            cell.study, {"gpu": cell.gpu.name, "title": cell.gpu.title, "rows": []}
        )
        there = None
        if cell.gpu.name != target.gpu.name:
            there = cell.in_unit(step_on(cell, target, efficiencies, count, per_op)[2])
        study["rows"].append(
            {
                "cell": cell.label,
                "gpus": cell.gpus,
                "unit": cell.unit,
                "published": cell.published,
                "predicted": cell.in_unit(p.step_s),
                "error": p.error,
                "efficiency_from": p.efficiency_from,
                "bound": p.bound,
                "on_target": there,
            }
        )
    for study, entry in studies.items():
        summary = summarize([p for p in predictions if p.cell.study == study])
        entry.update(
            median_error=summary.median_error,
            worst_error=summary.worst_error,
            median_factor=summary.median_factor,
            worst_factor=summary.worst_factor,
            worst_too_fast=summary.worst_too_fast,
        )
    return studies


# A compute range wider than this (its high end over its low end) is too wide to plan on: measure
# there instead.
MEASURE_OVER = 1.5
# A range holds the factor by which the estimate missed this share of the published cells, from the
# cells of at least RANGE_STUDIES studies (compute_range).
RANGE_COVERAGE = 0.8
RANGE_STUDIES = 2


@dataclass(frozen=True)
class ComputeRange:
    low: float  # the true compute time over the estimate, at least (<= 1)
    high: float  # and at most (>= 1)
    source: str  # the held-out cells it comes from, in words

    @property
    def span(self) -> float:
        return self.high / self.low


def compute_range(predictions: list[Prediction], family: str | None) -> ComputeRange:
    """How far a compute estimate may be off, from the method's error on the published cells: the
    factor by which it missed (Prediction.factor, whichever way) that RANGE_COVERAGE of the one-GPU
    cells stay within, either way of the estimate. The cells are those of the studies of `family`
    where they come from RANGE_STUDIES studies or more, else those of every study (a family one
    study covers, such as the CNN's single K80 cell, a user's model, a transformer), so a range
    never rests on one cell nor on one study. Two-sided whichever way those cells erred: on a GPU,
    model or framework none of them had, the way the estimate errs is not known, only how far."""
    one_gpu = [p for p in predictions if p.cell.gpus == 1]
    near = [p for p in one_gpu if model_family(p.cell.knobs.get("model")) == family]
    if len({p.cell.study for p in near}) < RANGE_STUDIES:
        near = one_gpu
    factors = sorted(p.factor for p in near)
    # the least of the cells' own factors that RANGE_COVERAGE of them are within
    factor = factors[math.ceil(RANGE_COVERAGE * len(factors)) - 1]
    studies = ", ".join(dict.fromkeys(f"{p.cell.study} ({p.cell.gpu.name})" for p in near))
    source = (
        f"a factor of {factor:.2f} either way: at least {100 * RANGE_COVERAGE:.0f} % of the "
        f"{len(near)} one-GPU published cells of {studies} were estimated within it"
    )
    return ComputeRange(1 / factor, factor, source)
