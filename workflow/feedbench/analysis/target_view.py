"""The report's section "On <target>": every training cell predicted on the node a cluster job will
run on (issue #25, "what the user gets"), and what to ask Slurm for.

For each single-process training cell of results/target.json (rule target: the step counted here on
the CPU and estimated on the target's GPU, feedbench.harness.flops.target_estimates):

    compute   the estimated seconds of a step on the target's GPU (core.estimate's per-operation
              estimate), or with `compute: measured` those its compute ceiling measured there, where
              it ran on the target's GPU
    copy      the batch's bytes over the target's link: the bytes a step of the cell copied here
              where it ran (measured_bytes), else those of target.json (a batch drawn from the
              user's pipeline, or the knobs')
    loader    the worker-scaling curve fitted on this run's loader cells of the same loader (knobs
              the loader ceiling keeps, workers aside: feedbench.analysis.loader_scaling), at the
              cores the cell would have there and scaled by the target's CPU speed

combined by the prediction model of the ceilings (feedbench.analysis.predict.predict): the same rule
as here. Then the fewest workers per GPU that reach LOADER_REACHES (95 %) of the trainer's side on
the target, the Slurm line for them (cpus_per_task: a rank and its workers,
core.resources.cpus_per_rank; mem_mb from the cell's measured memory), and how much of the step
waits on data with the site's default CPUs per GPU (`target.default_cpus_per_gpu`).

Every figure is a prediction; the compute estimate's error on the studies' published cells comes
from target.json, which the rule takes from the function the benchmark of
docs/results/prediction-error.md uses.
"""

from __future__ import annotations

import json
import math
import statistics

from ..core.ceilings import LOADER_REACHES, PROBE_LABELS, ceiling_knobs, trainer_seconds
from ..core.cpu_speed import SHARED_BELOW_PCT
from ..core.knobs import KNOBS, kept_by
from ..core.records import Record, by_cell
from ..core.resources import cpus_per_rank
from ..core.target import link_seconds
from .loader_scaling import (
    LoaderPoint,
    ScalingFit,
    fit_scaling,
    fit_text,
    loader_ceiling,
    loader_point,
)
from .predict import predict
from .views import Table

ERROR_PAGE = "docs/results/prediction-error.md"
LOADER_ERROR_PAGE = "docs/results/prediction-error-loader.md"
# The knobs that make two loader cells the same loader, whatever their workers and however long they
# measured.
SAME_LOADER = tuple(k for k in kept_by("loader") if k != "num_workers" and k not in PROBE_LABELS)
MB_PER_GIB = 1024


def _value(knobs: dict, name: str) -> str:
    return json.dumps(knobs.get(name, KNOBS[name].default), sort_keys=True)


def same_loader(loader: dict, training: dict) -> bool:
    """Whether a loader cell's knobs measure the loader of a training cell (its loader ceiling, any
    workers)."""
    wanted = ceiling_knobs(training, "loader")
    return all(_value(loader, k) == _value(wanted, k) for k in SAME_LOADER)


def loader_points(records: list[Record]) -> list[tuple[dict, LoaderPoint]]:
    """(cell knobs, point) of every completed loader cell among the records."""
    points = ((record.cell or {}, loader_point(record)) for record in records)
    return [(knobs, point) for knobs, point in points if point is not None]


def trainer_rate(cell: dict) -> float:
    """Samples/s of the trainer's side on the target: compute and copy, overlapped as the knobs
    say."""
    return cell["batch_size"] / trainer_seconds(
        cell["compute_s"], cell["copy_s"], cell["stream_prefetch"]
    )


def cell_link(cell: dict, target: dict) -> float:
    """The GB/s a cell's copy reaches on the target (its pinned or pageable share of the link:
    core.target), or the link itself in a target.json written before the shares."""
    return cell.get("copy_gb_per_s") or target["link_gb_per_s"]


def predicted(
    cell: dict, fit: ScalingFit, target: dict, workers: int, cores: int
) -> tuple[float | None, str | None]:
    """(samples/s, bound) of a training cell on the target with `workers` loader workers on `cores`
    cores."""
    loader = loader_ceiling(fit, cores, workers, target["cpu_speed"])
    rate, bound, _ = predict(
        loader,
        cell["batch_size"] / cell["compute_s"],
        workers,
        cell["batch_size"],
        cell["batch_bytes"],
        cell_link(cell, target),
        cell["stream_prefetch"],
    )
    return rate, bound


def fewest_workers(cell: dict, fit: ScalingFit, target: dict) -> tuple[int, float | None, bool]:
    """(workers, share of the trainer's side predicted, reached): the fewest workers, each with a
    core beside the rank's, whose prediction reaches LOADER_REACHES of the trainer's side; else the
    most that fit the target's cores per GPU, with reached False."""
    ceiling = trainer_rate(cell)
    workers, share = 0, None
    for workers in range(1, target["cores_per_gpu"]):
        rate, _ = predicted(cell, fit, target, workers, cpus_per_rank({"num_workers": workers}))
        share = rate / ceiling if rate else None
        if share is not None and share >= LOADER_REACHES:
            return workers, share, True
    return workers, share, False


def memory_mb(records: list[Record], workers: int) -> int | None:
    """mem_mb for a rank with `workers` workers from a cell's measured memory (the monitor's peak
    PSS of its main process, and of its workers over their number; the most over its repeats),
    rounded up to whole GiB; None where the cell measured none."""
    main, per_worker = None, 0.0
    for record in records:
        stats = record.monitor.get("stats") or {}
        trainer = (stats.get("trainer_pss_mb") or {}).get("max")
        if trainer is None:
            continue
        main = max(main or 0.0, float(trainer))
        count = int((record.cell or {}).get("num_workers") or 0)
        pooled = (stats.get("workers_pss_mb") or {}).get("max")
        if count and pooled is not None:
            per_worker = max(per_worker, float(pooled) / count)
    if main is None:
        return None
    return int(math.ceil((main + per_worker * workers) / MB_PER_GIB) * MB_PER_GIB)


def starved(cell: dict, fit: ScalingFit, target: dict, cpus: int | None) -> dict | None:
    """With `cpus` per GPU (the site's default): its workers (one core is the rank's), the predicted
    samples/s, and the share of the trainer's time lost waiting on data (1 - predicted / trainer's
    side)."""
    if not cpus:
        return None
    workers = max(cpus - 1, 0)
    rate, bound = predicted(cell, fit, target, workers, cpus)
    if rate is None:
        return {
            "cpus": cpus,
            "workers": workers,
            "predicted": None,
            "starved_pct": None,
            "bound": None,
        }
    lost = max(0.0, 1 - rate / trainer_rate(cell))
    return {
        "cpus": cpus,
        "workers": workers,
        "predicted": rate,
        "starved_pct": 100 * lost,
        "bound": bound,
    }


def measured_bytes(records: list[Record]) -> float | None:
    """The bytes a step of a training cell copied to the device here (metrics.h2d_bytes over its
    steps), the median over its repeats; None where no repeat recorded them (a result older than the
    figure, or a failed cell)."""
    per_step = []
    for record in records:
        metrics = record.metrics  # by the metric table's names: metrics.steps is measured_steps
        if record.status == "ok" and metrics.get("h2d_bytes") and metrics.get("measured_steps"):
            per_step.append(metrics["h2d_bytes"] / metrics["measured_steps"])
    return statistics.median(per_step) if per_step else None


def with_measured_copy(cell: dict, records: list[Record], link_gb_per_s: float) -> dict:
    """A cell of target.json with its copy priced from the bytes its steps copied here, where it ran
    (measured_bytes): every batch of the window, where target.json's is one batch drawn before the
    run (or the knobs' shape)."""
    size = measured_bytes(records)
    if size is None:
        return cell
    return {
        **cell,
        "batch_bytes": size,
        "batch_bytes_from": "measured",
        "copy_s": link_seconds(size, link_gb_per_s),
    }


def _fit(cell: dict, loaders: list[tuple[dict, LoaderPoint]]) -> tuple[ScalingFit | None, str]:
    """The worker-scaling curve of the cell's loader, or None and why not."""
    points = [point for knobs, point in loaders if same_loader(knobs, cell["knobs"])]
    try:
        fit = fit_scaling(points)
    except ValueError as error:
        return None, str(error)
    return fit, fit_text(fit)


def cell_row(key: str, cell: dict, loaders: list, target: dict, records: list[Record]) -> dict:
    """One training cell's row of the section: predictions on the target, the workers and the Slurm
    line."""
    row = {"cell": key, "family": cell.get("family"), "efficiency": cell.get("efficiency")}
    row["efficiency_from"] = cell.get("efficiency_from")
    row["compute_from"] = cell.get("compute_from", "estimated")
    # The GPU waits on the host (core.estimate.host_bound): its range is open above.
    row["host_bound"] = row["compute_from"] == "estimated" and bool(cell.get("host_bound"))
    row["kernels"], row["host_s"] = cell.get("kernels"), cell.get("host_s")
    # with `compute: measured`: how its cell on the target's GPU went
    row["measured"] = cell.get("measured")
    if "compute_s" not in cell:
        measured = f"; measured there: {row['measured']}" if row["measured"] else ""
        return {**row, "note": f"no compute estimate: {cell.get('error')}{measured}"}
    row["compute_ceiling"] = trainer_rate(cell)
    fit, fit_line = _fit(cell, loaders)
    row["loader_fit"] = fit_line
    if fit is None:
        return {**row, "note": f"no loader prediction: {fit_line}"}
    workers = cell["num_workers"]
    row["predicted"], row["bound"] = predicted(cell, fit, target, workers, target["cores_per_gpu"])
    row["workers"], row["share"], row["reached"] = fewest_workers(cell, fit, target)
    row["cpus_per_task"] = cpus_per_rank({"num_workers": row["workers"]})
    row.update(range_row(cell, fit, target))
    row["mem_mb"] = memory_mb(records, row["workers"])
    row["default"] = starved(cell, fit, target, target.get("default_cpus_per_gpu"))
    return row


def range_row(cell: dict, fit: ScalingFit, target: dict) -> dict:
    """The predicted samples/s and the cpus_per_task at both ends of the compute's range
    (results/target.json's compute_range_s: the estimate's published error on the nearest family),
    fast end first; None at an end the range leaves open (the launch floor has no upper end). Empty
    where the compute has no range (measured there)."""
    ends = cell.get("compute_range_s")
    if not ends:
        return {}
    rates, cpus = [], []
    for seconds in ends:
        if seconds is None:
            rates.append(None)
            cpus.append(None)
            continue
        at = {**cell, "compute_s": seconds}
        rates.append(predicted(at, fit, target, cell["num_workers"], target["cores_per_gpu"])[0])
        cpus.append(cpus_per_rank({"num_workers": fewest_workers(at, fit, target)[0]}))
    return {
        "predicted_range": rates,
        "cpus_range": cpus,
        "range_from": cell.get("range_from"),
        "range_span": cell.get("range_span"),
        "measure_there": bool(cell.get("measure_there")),
    }


def cpu_speed_text(target: dict) -> str:
    """How the target's CPU speed factor came to be, for the section's first line: given in the
    config, or measured by the reference loader cell there and here
    (harness.cpu_speed.target_speed), with both figures."""
    if target.get("cpu_speed_from") != "measured":
        return f"{target['cpu_speed']}x a core here (given in the config)"
    there, here = (
        _speed_figure(target["cpu_speed_there"], "there"),
        _speed_figure(target["cpu_speed_here"], "here"),
    )
    return (
        f"{target['cpu_speed']:.2f}x a core here, measured: the reference loader cell (python -m "
        f"feedbench cpu-speed) gave {there} and {here}"
    )


def _speed_figure(record: dict, where: str) -> str:
    """One cpu-speed record in words: its samples/s on one core, the CPU, the repeats and their
    spread."""
    repeats = record.get("repeats") or []
    shares = [share for share in record.get("cpu_pct") or [] if share is not None]
    shared = (
        f", its core shared: {min(shares):.0f} % of it"
        if shares and min(shares) < SHARED_BELOW_PCT
        else ""
    )
    return (
        f"{record['samples_per_s_per_core']:.1f} samples/s on one core {where} ("
        f"{record.get('cpu')}; {len(repeats)} repeats, spread {record.get('spread_pct', 0):.0f} %"
        f"{shared})"
    )


def read_estimates(target_json: str) -> dict:
    """results/target.json, read once for the section and the study views."""
    with open(target_json, encoding="utf-8") as f:
        return json.load(f)


def build(estimates: dict, records: list[Record]) -> dict:
    """The section's context from results/target.json (read_estimates) and the records of the run's
    results (core.records: loader cells and the training cells' memory)."""
    target = estimates["target"]
    found = by_cell(records)
    loaders = loader_points([record for own in found.values() for record in own])
    rows = []
    for key, cell in sorted(estimates["cells"].items()):
        own = found.get(key, [])
        # as run, else as planned
        knobs = next((r.cell for r in own if r.cell), None) or cell["knobs"]
        cell = with_measured_copy(cell, own, cell_link(cell, target))
        rows.append(cell_row(key, {**cell, "knobs": knobs}, loaders, target, own))
    return {
        "target": target,
        "error": estimates["published_error"],
        "measure_over": estimates.get("measure_over"),
        "rows": rows,
        "cpu_speed": cpu_speed_text(target),
        "reaches_pct": 100 * LOADER_REACHES,
        "error_page": ERROR_PAGE,
        "loader_error_page": LOADER_ERROR_PAGE,
    }


UNITS = {"samples/s": "samples/s", "s": "time of the run [s]"}


def beside_published(estimates: dict | None, study: str) -> tuple[Table | None, list[str]]:
    """The study view's table of every published cell with its prediction (results/target.json's
    `published`, core.estimate.beside_published), and the notes that say how to read it; (None, [])
    without a target or when the study published no GPU figure."""
    if not estimates:
        return None, []
    entry = (estimates.get("published") or {}).get(study)
    if not entry:
        return None, []
    target = estimates["target"]
    unit = UNITS[entry["rows"][0]["unit"]]
    columns = [
        "published cell",
        f"published, {unit}",
        f"predicted on {entry['gpu']}, {unit}",
        "absolute error",
    ]
    rows = [
        [r["cell"], r["published"], r["predicted"], f"{100 * r['error']:.1f} %"]
        for r in entry["rows"]
    ]
    elsewhere = any(r["on_target"] is not None for r in entry["rows"])
    if elsewhere:
        columns.append(f"predicted on {target['gpu']} (the target), {unit}")
        for row, r in zip(rows, entry["rows"], strict=True):
            row.append(r["on_target"])
    caption = (
        f"Predicted beside published on {entry['title']}: a prediction, not a measurement (the "
        "step's FLOPs and bytes counted here, each operation priced at the GPU's public kernel "
        "figures or its memory's achieved bandwidth, fitted to no published throughput); median "
        "error "
        f"{100 * entry['median_error']:.1f} % (a factor of {entry['median_factor']:.2f}), worst "
        f"a factor of {entry['worst_factor']:.1f} "
        f"{'too fast' if entry['worst_too_fast'] else 'too slow'} ({ERROR_PAGE})"
    )
    notes = [
        "The predictions beside the published figures never saw them: each is made from public "
        "kernel-level figures alone (workflow/feedbench/core/kernels.yaml), so their error is "
        "what a model whose throughput no one published gets."
    ]
    if any(r["gpus"] > 1 for r in entry["rows"]):
        notes.append(
            "A row of more than one GPU is predicted as that many GPUs each stepping alone: the "
            "estimate has no communication (all-reduce, DataParallel's scatter and gather), "
            "which those rows' errors include."
        )
    if elsewhere:
        notes.append(
            f"The target's GPU ({target['gpu']}) is not the study's ({entry['gpu']}): its column "
            "predicts the study's protocol there from that GPU's kernel figures, with no published "
            "figure to check it against."
        )
    return Table(caption, columns, rows), notes
