"""Stage what-ifs predicted from a cell's stage profile (analysis.predict.predict_whatif: the model;
analysis.stages: the profile): for a cell run with a what-if knob (cache_after, skip_stages,
device_stages) from its baseline's profile, and, for a measured cell, the table of its top stages
each costing nothing, cached after, or moved to the device.
"""

from __future__ import annotations

import pandas as pd

from ..core.knobs import KNOBS, STAGE_WHATIFS
from . import stages
from .predict import crossing_bytes, predict_whatif, taken_out
from .stages import column_median

# The stages a what-if cannot take out of the workers: the rest of each sample and the batch's
# collate.
NOT_MOVABLE = (stages.UNATTRIBUTED, "collate")
TOP_STAGES = 3
SHOWN = 3  # what-ifs per cell the report shows; the rest it folds


def order_of(rows: pd.DataFrame, column: str = "stage_order") -> list[str]:
    """The pipeline's stages in order, as the cell's rows recorded them (summary column
    stage_order); or another such list: stage_decorated, stage_on_device."""
    values = rows[column].dropna() if column in rows else ()
    return str(values.iloc[0]).split(" > ") if len(values) else []


def _set(value) -> bool:
    return value not in (None, "", "[]", []) and not (isinstance(value, float) and pd.isna(value))


def whatifs_of(knobs: dict) -> dict:
    """The stage what-if knobs a cell sets: knob -> value (skip_stages as a list)."""
    import json

    found = {k: knobs.get(k) for k in STAGE_WHATIFS if _set(knobs.get(k))}
    if isinstance(found.get("skip_stages"), str):
        found["skip_stages"] = json.loads(found["skip_stages"])
    return found


def changed_data(rows: pd.DataFrame) -> set:
    """The cells among the summary's rows that measured other data: they skipped stages
    (skip_stages), or their cache froze a random stage's draws (whatif_frozen, found by what the
    stage does: harness.randomness.differs)."""
    return {
        cell
        for column in ("skip_stages", "whatif_frozen")
        if column in rows
        for cell, value in zip(rows["cell"], rows[column], strict=True)
        if _set(value)
    }


def random_stages(rows: pd.DataFrame) -> list[str]:
    """The stages a cell's warm-up found random (summary column stage_random: their output on the
    same input differed between two calls), over its repeats."""
    found = rows["stage_random"].dropna() if "stage_random" in rows else ()
    return sorted({name for text in found for name in str(text).split(" > ") if name})


def frozen_by(kind: str, stage, rows: pd.DataFrame) -> list[str]:
    """The random stages (random_stages) whose draws a what-if on a cell would freeze: those it
    caches (cache_after at or after them), in the pipeline's order; [] for any other what-if."""
    if kind != "cache_after":
        return []
    drawn = random_stages(rows)
    taken = taken_out(order_of(rows), kind, stage, order_of(rows, "stage_decorated"))
    return [name for name in taken if name in drawn]


def predict_cell(
    knobs: dict, baseline: pd.DataFrame, rates: tuple, copy: tuple, device_ms_per_batch=None
):
    """(samples/s, bound, terms) of a what-if cell from its baseline's stage profile and the
    ceilings `rates` (loader, compute) it shares with it; `copy`: (bytes of the baseline's batch,
    GB/s). The moved stages' cost on the device is the cell's own, measured (device_ms_per_batch),
    else taken as their cost in the worker. The samples/s is the baseline's measured one times what
    the model gives the what-if over what it gives the baseline: the ceilings' own error on the
    baseline (their prediction_error_pct) is not the what-if's. (None, None, {}) without a
    profile."""
    profile, order = stages.profile(baseline), order_of(baseline)
    if profile is None:
        return None, None, {}
    out, moved = set(), []
    for kind, value in whatifs_of(knobs).items():
        names = taken_out(order, kind, value, order_of(baseline, "stage_decorated"))
        out.update(names)
        moved = names if kind == "device_stages" else moved
    ms = {name: mean for name, (mean, _share) in profile["stages"].items()}
    saved = sum(ms.get(name, 0.0) for name in out)
    batch = int(knobs.get("batch_size") or 1)
    device = sum(ms.get(name, 0.0) for name in moved)
    if moved and device_ms_per_batch is not None and not pd.isna(device_ms_per_batch):
        device = float(device_ms_per_batch) / batch
    workers = int(knobs.get("num_workers") or 0)
    size = crossing_bytes(copy[0], moved) if moved else copy[0]
    stream = knobs.get("device_prefetch") == "stream"
    predicted, bound, terms = predict_whatif(
        rates, workers, batch, profile["worker_ms"], saved, device, (size, copy[1]), stream
    )
    as_is = predict_whatif(rates, workers, batch, profile["worker_ms"], 0.0, 0.0, copy, stream)[0]
    measured = column_median(baseline, "samples_per_s")
    # the model's ratio, on the baseline as it was measured, never above the what-if's compute
    # ceiling (its trainer's side: the ceiling plus the stages it moves there)
    if predicted is not None and as_is and measured:
        predicted = min(measured * predicted / as_is, 1000 / terms["compute"])
    return predicted, bound, terms


def top_stages(rows: pd.DataFrame, n: int = TOP_STAGES) -> list[str]:
    """The costliest stages of a cell that a what-if can take out (not the unattributed rest, not
    collate)."""
    profile = stages.profile(rows)
    if profile is None:
        return []
    movable = [
        (name, share) for name, (_ms, share) in profile["stages"].items() if name not in NOT_MOVABLE
    ]
    return [name for name, _ in sorted(movable, key=lambda item: -item[1])[:n]]


def can_take(rows: pd.DataFrame) -> dict:
    """Each stage what-if knob (knobs.STAGE_WHATIFS) -> the stages of a cell it may take out (None:
    any), in the order the report's table lists them."""
    return {
        "skip_stages": None,  # any stage may cost nothing
        "cache_after": order_of(rows) + order_of(rows, "stage_decorated"),
        # never a span, a Python function, read or decode
        "device_stages": order_of(rows, "stage_on_device"),
    }


def table(rows: pd.DataFrame, knobs: dict, rates: tuple, copy: tuple) -> list[dict]:
    """A measured training cell's top stages, each as labelled predictions (costs nothing; cached
    after it, for a stage of the pipeline's order or a @feedbench.stage function; on the device, for
    a stage from which on the sampled call took and gave tensors, at its cost in the worker, the
    batch crossing as it then is): the loader ceiling, samples/s and bound; [] without a stage
    profile or ceilings."""
    found = []
    for name in top_stages(rows):
        for kind, can in can_take(rows).items():
            if can is not None and name not in can:
                continue
            value = [name] if kind == "skip_stages" else name
            predicted, bound, terms = predict_cell({**knobs, kind: value}, rows, rates, copy)
            if predicted is None:
                return []
            frozen = frozen_by(kind, name, rows)
            found.append(
                {
                    "stage": name,
                    "knob": kind,
                    "what": KNOBS[kind].whatif,
                    "loader_per_s": terms["loader_per_s"],
                    "predicted": predicted,
                    "bound": bound,
                    # never a fix: it changes the augmentation
                    "frozen": frozen,
                    "changes": f"changes your augmentation: freezes {', '.join(frozen)}"
                    if frozen
                    else None,
                }
            )
    return found


def experiment_table(rows: pd.DataFrame, metric: str = "samples_per_s") -> list[dict]:
    """The report's stage what-ifs of one experiment: for each finished training cell without a
    what-if that has a stage profile and ceilings, its top stages' three predictions (table), beside
    its measured throughput; fastest first, the first SHOWN of each cell marked `shown` (the report
    folds the rest). Figures are in the experiment's `metric`: where it is tokens_per_s, the
    samples/s the model predicts times the cell's tokens per sample. The copy term needs the batch's
    bytes: known for the built-in datasets; a user's batch crosses uncounted here."""
    from ..core.ceilings import batch_bytes
    from ..core.knobs import KNOBS, user_batch

    ok = (
        rows[(rows["status"] == "ok") & (rows["scenario"] == "train")]
        if "scenario" in rows
        else rows.iloc[0:0]
    )
    found = []
    for cell, group in ok.groupby("cell", sort=False):
        first = group.iloc[0]
        knobs = {k: first[k] for k in KNOBS if k in group and not _missing(first[k])}
        if whatifs_of(knobs):
            continue
        rates = (
            column_median(group, "ceiling_loader_samples_per_s"),
            column_median(group, "ceiling_compute_samples_per_s"),
        )
        bandwidth = column_median(group, "ceiling_copy_gb_per_s")
        size = batch_bytes(knobs) if bandwidth and not user_batch(knobs) else None
        measured, samples = column_median(group, metric), column_median(group, "samples_per_s")
        scale = measured / samples if measured and samples else 1.0
        predictions = table(group, knobs, rates, (size, bandwidth if size else None))
        predictions.sort(key=lambda row: -(row["predicted"] or 0))
        for rank, row in enumerate(predictions):
            row.update(
                {k: row[k] * scale for k in ("predicted", "loader_per_s") if row[k] is not None}
            )
            found.append({"cell": cell, "measured": measured, "shown": rank < SHOWN, **row})
    return found


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and pd.isna(value))
