"""Study view `breakdown`: load / transfer / processing per batch for pinning x non_blocking under
each timing mode (forum post; docs/studies.md)."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from ..aggregate import as_requested, is_true
from ..labels import cell_labels
from ..plots import PHASE_COLOURS, fit_ticks, plain, slot
from . import Table, View, common_notes, cpu_only, hardware, median_by, unfinished, with_gpus

# The post's three parts of a batch, each the sum of our phases named in the module's TEXT.
PARTS = {
    "load_ms": ("load", PHASE_COLOURS["wait"]),
    "transfer_ms": ("transfer", PHASE_COLOURS["h2d"]),
    "processing_ms": ("processing", PHASE_COLOURS["fwd"]),
}
TIMINGS = {
    "events": "CUDA events, no host sync",
    "sync": "sync at every phase boundary",
    "naive": "host clock, no sync",
}
KEYS = ["timing", "pin_memory", "non_blocking"]
# Where a statement applies: the model, the GPUs and the batch over all GPUs (the post's batch sizes
# are totals).
CASE = ["model", "gpus", "batch"]

TEXT = """\
The forum post split each batch into loading (the trainer waiting for the DataLoader), transfer \
(the .cuda() calls) and processing (forward, loss, backward, update), and was surprised by how the \
three moved when it turned pin_memory and non_blocking off. Here load = wait_ms, transfer = h2d_ms \
and processing = fwd_ms + bwd_ms + opt_ms, medians per step over the measured window and the \
repeats.

The same cells are shown under the three timing modes side by side: events reads CUDA events after \
the window (what the GPU spent, without making the host wait), naive reads the host clock with no \
synchronisation (how the post timed), and sync synchronises at every phase boundary. sync is not \
the post's follow-up, which synchronised only after .cuda(): there the wait also absorbed GPU work \
still queued from the previous step's processing, so its transfer time was the copy plus that \
leftover; with sync the previous step has finished before the copy starts. Where naive and events \
disagree, the naive split is an artefact of asynchronous CUDA, not a cost.

The bars of the events mode do not add up to the step: load is host time (waiting for the loader) \
while transfer and processing are GPU time, and the GPU keeps running while the host waits, so the \
phases overlap. The black mark on each bar is the measured step (host clock, start to start).

The post's statements are listed, each matched to our cells of its own model, GPU count and batch, \
with the explanation of each; it published no number (its tables are in a linked report). Its Q1 \
compares the processing time per GPU of 1 GPU against DataParallel on 4: that comparison has its \
own table, per model."""

EXPLAIN = {
    "Q1": "Host clocks without synchronisation time kernel launches, not kernels: the GPU's "
    "work is paid wherever the host next waits for it (a blocking copy, loss.item()), "
    "possibly in another phase or step. Per-phase times taken that way do not compare "
    "between 1 and 4 GPUs; CUDA events do.",
    "Q2": "A copy from pageable memory is staged by the driver through a pinned buffer and "
    "the host waits for it: non_blocking=True has no effect there. Compare the "
    "pin_memory=false bars with non_blocking on and off.",
    "Q3": "The blocking copy from pageable memory waits for the GPU work queued before it "
    "(the previous backward and update), so that time is counted as transfer and "
    "leaves processing. Loading rises because with pin_memory=True a thread of the "
    "main process takes each batch off the workers' queue and pins it while the "
    "trainer computes; with it off, the trainer unpacks each batch inside next(), in "
    "the loading time.",
    "follow-up": "The author's reading is right: with pinned memory and non_blocking the "
    "copy returns at once and its cost lands in processing. The post "
    "synchronised after .cuda() only, so its transfer also took in the previous "
    "step's unfinished GPU work; timing=sync here synchronises at every phase "
    "boundary, so its transfer is the copy alone (a lower bound of the post's). "
    "CUDA events (timing=events) split the phases without making the host wait.",
}


def _phases(rows: pd.DataFrame, others: list[str]) -> pd.DataFrame:
    """Median load, transfer, processing and step ms per (timing, pin_memory, non_blocking, other
    knobs), timings in TIMINGS order.

    Each row also carries its case (CASE): the model, the GPUs it trained on and its batch over all
    of them.
    """
    rows = with_gpus(as_requested(rows, KEYS))
    rows = rows.assign(batch=pd.to_numeric(rows["batch_size"], errors="coerce") * rows["gpus"])
    others = [*others, *(k for k in CASE if k not in others)]
    numbers = {
        c: pd.to_numeric(rows[c], errors="coerce")
        for c in ("wait_ms", "h2d_ms", "fwd_ms", "bwd_ms", "opt_ms")
    }
    rows = rows.assign(
        load_ms=numbers["wait_ms"],
        transfer_ms=numbers["h2d_ms"],
        processing_ms=numbers["fwd_ms"] + numbers["bwd_ms"] + numbers["opt_ms"],
        pin_memory=[is_true(v) for v in rows["pin_memory"]],
        non_blocking=[is_true(v) for v in rows["non_blocking"]],
    )
    table = median_by(rows, [*KEYS, *others], [*PARTS, "step_ms_median"])
    table = table.drop(
        columns=[k for k in ("gpus_per_node", "batch_size") if k in table and k not in CASE]
    )
    order = {t: i for i, t in enumerate(TIMINGS)}
    return table.sort_values("timing", key=lambda t: t.map(order), kind="stable", ignore_index=True)


def _figure(table: pd.DataFrame, others: list[str], here: str) -> Figure:
    timings = list(table["timing"].drop_duplicates())
    fig = Figure(figsize=(3.4 * len(timings) + 1, 4.4), layout="constrained")
    axes = fig.subplots(1, len(timings), sharey=True, squeeze=False)[0]
    for ax, timing in zip(axes, timings, strict=True):
        part = table[table["timing"] == timing]
        bottom = pd.Series(0.0, index=part.index)
        for column, (label, colour) in PARTS.items():
            height = part[column].astype(float).fillna(0.0)
            ax.bar(range(len(part)), height, bottom=bottom, color=colour, label=label)
            bottom = bottom + height
        step = part["step_ms_median"].astype(float)
        ax.scatter(
            range(len(part)),
            step,
            marker="_",
            s=400,
            color="black",
            zorder=3,
            label="step (host clock)",
        )
        if timing == "events":
            ax.text(
                0.5,
                0.98,
                "host-clock load + GPU-event phases:\nthey overlap, so need not sum to the step",
                transform=ax.transAxes,
                ha="center",
                va="top",
                fontsize="x-small",
            )
        shown = [
            k for k in ("pin_memory", "non_blocking", *others) if part[k].astype(str).nunique() > 1
        ]
        # `pin_memory=true gpus=2`
        labels = [plain(label) for label in cell_labels(part.to_dict("records"), shown)]
        fit_ticks(ax, range(len(part)), labels, slot(ax, len(part)))
        ax.set_title(f"{timing}: {TIMINGS.get(timing, '')}", fontsize="medium")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("median ms per step")
    fig.suptitle(plain(f"Measured on {here}"), fontsize="medium")
    fig.legend(
        *axes[0].get_legend_handles_labels(),
        loc="outside lower center",
        ncols=len(PARTS) + 1,
        fontsize="small",
    )
    return fig


def _per_gpu(table: pd.DataFrame) -> pd.DataFrame:
    """Processing ms per step at the same batch per GPU: one GPU against DataParallel on the most
    GPUs measured, per model and case."""
    known = table.dropna(subset=["gpus", "batch"])
    if known.empty or known["gpus"].nunique() < 2:
        return pd.DataFrame()
    one, many = int(known["gpus"].min()), int(known["gpus"].max())
    known = known.assign(per_gpu=(known["batch"] / known["gpus"]).astype(int))
    keys = ["model", "per_gpu", *KEYS]
    wide = known[known["gpus"].isin([one, many])].pivot_table(
        index=keys, columns="gpus", values="processing_ms", aggfunc="median"
    )
    if one not in wide or many not in wide:
        return pd.DataFrame()
    wide = wide[[one, many]].dropna().reset_index()
    label_one, label_many = (
        f"processing, {one} GPU [ms]",
        f"processing, DataParallel on {many} GPUs [ms]",
    )
    wide = wide.rename(columns={one: label_one, many: label_many, "per_gpu": "batch per GPU"})
    wide[f"{many} GPUs / {one} GPU"] = wide[label_many] / wide[label_one]
    return wide


def _matched(said: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """Each statement once per model we measured, with our medians for its own GPU count and total
    batch."""
    models = [m for m in table["model"].dropna().unique()] if "model" in table else []
    said = said.merge(pd.DataFrame({"model": models or [None]}), how="cross")
    at = table.set_index([*KEYS, *CASE])

    def value(timing, pin, nb, model, gpus, batch, phase):
        column = f"{phase}_ms"
        key = (timing, pin, nb, model, gpus, batch)
        if column not in at or key not in at.index:
            return None
        found = at.loc[[key], column]
        return float(found.median()) if found.notna().any() else None

    said["measured at this timing [ms]"] = [
        value(t, pin, nb, m, g, b, p)
        for t, pin, nb, m, g, b, p in said[
            [*KEYS, "model", "gpus", "batch_size", "phase"]
        ].itertuples(index=False)
    ]
    said["measured with events [ms]"] = [
        value("events", pin, nb, m, g, b, p)
        for pin, nb, m, g, b, p in said[
            ["pin_memory", "non_blocking", "model", "gpus", "batch_size", "phase"]
        ].itertuples(index=False)
    ]
    return said


def _measured_table(table: pd.DataFrame, here: str) -> Table:
    return Table.of(
        table.rename(
            columns={
                "load_ms": "load [ms]",
                "transfer_ms": "transfer [ms]",
                "processing_ms": "processing [ms]",
                "step_ms_median": "step [ms]",
                "batch": "batch (all GPUs)",
            }
        ),
        f"Measured on {here}: median ms per step of each phase, per timing mode",
    )


NO_PER_GPU = (
    "No pair of cells with one GPU and DataParallel at the same batch per GPU finished: the "
    "post's Q1 comparison (processing time per GPU) is not shown."
)


def _published(reference: pd.DataFrame, table: pd.DataFrame, here: str) -> tuple[Table, list[str]]:
    """The post's statements beside our measurement of the same case, and a note per statement none
    matches."""
    where = ", ".join(reference["hardware"].astype(str).unique())
    said = reference.assign(
        pin_memory=[is_true(v) for v in reference["pin_memory"]],
        non_blocking=[is_true(v) for v in reference["non_blocking"]],
        explanation=reference["item"].map(EXPLAIN).where(~reference["item"].duplicated()),
    )
    said = _matched(said, table)
    said["explanation"] = said["explanation"].where(~said["item"].duplicated())
    unmatched = said[said["measured at this timing [ms]"].isna()][
        ["item", "model", "gpus", "batch_size", "timing"]
    ].drop_duplicates()
    notes = [
        f"{item}: no measured cell of model={model} on {gpus} GPU(s) at batch {batch} in all with "
        f"timing={timing}; its row shows no measured value"
        for item, model, gpus, batch, timing in unmatched.itertuples(index=False)
    ]
    columns = [
        "item",
        "model",
        "gpus",
        "batch_size",
        *KEYS,
        "phase",
        "reported",
        "measured at this timing [ms]",
    ]
    published = Table.of(
        said[[*columns, "measured with events [ms]", "explanation"]].rename(
            columns={"batch_size": "batch (all GPUs)"}
        ),
        f"Published ({', '.join(reference['source'].astype(str).unique())}, {where}): what the "
        "post reported, and our measurement of the same model, GPU count, batch, pinning, "
        f"non_blocking and timing on {here}, and why",
    )
    return published, notes


def _verdict(table: pd.DataFrame, shown: list[str]) -> str | None:
    """The shortest step among the cells timed with events (else sync), with its phases."""
    trusted = (
        table[table["timing"] == "events"]
        if (table["timing"] == "events").any()
        else table[table["timing"] == "sync"]
    )
    if not len(trusted) or not trusted["step_ms_median"].notna().any():
        return None
    best = trusted.loc[trusted["step_ms_median"].astype(float).idxmin()]
    case = "".join(f", {k}={best[k]}" for k in shown)
    return (
        f"Shortest step, timed with {best['timing']}: pin_memory="
        f"{str(best['pin_memory']).lower()}, non_blocking={str(best['non_blocking']).lower()}"
        f"{case} ({best['step_ms_median']:.1f} ms: load {best['load_ms']:.1f}, transfer "
        f"{best['transfer_ms']:.1f}, processing {best['processing_ms']:.1f})."
    )


CPU_ONLY = (
    "Every cell ran on the CPU (no GPU in the results): the three timing modes read the same "
    "host clock and pinning and non_blocking do nothing, so the post's surprises cannot appear "
    "here; they need a GPU."
)


def build(rows: pd.DataFrame, reference: pd.DataFrame | None, spec: dict) -> View:
    others = [k for k in spec.get("matrix") or {} if k not in KEYS and k in rows]
    table = _phases(rows, others)
    shown = [
        k
        for k in dict.fromkeys([*others, *CASE])
        if k in table and table[k].nunique(dropna=False) > 1
    ]
    here = hardware(rows)
    view = View(
        "breakdown",
        TEXT,
        notes=common_notes(rows, reference, spec, "breakdown") + unfinished(rows, [*KEYS, *others]),
    )
    view.tables.append(_measured_table(table, here))
    per_gpu = _per_gpu(table)
    if len(per_gpu):
        view.tables.append(
            Table.of(
                per_gpu,
                f"Measured on {here}: processing time per step at the same batch per GPU, one "
                "GPU against DataParallel (the post's Q1); with perfect scaling the ratio is 1",
            )
        )
    else:
        view.notes.append(NO_PER_GPU)
    if reference is not None:
        published, notes = _published(reference, table, here)
        view.notes += notes
        view.tables.insert(0, published)
    if len(table):
        view.figure = _figure(table, shown, here)
        view.verdict = _verdict(table, shown)
        missing = [t for t in TIMINGS if t not in set(table["timing"])]
        if missing:
            view.notes.append(
                f"No cells with timing={', '.join(missing)}: the side-by-side comparison of "
                "timing modes is incomplete."
            )
    if cpu_only(rows):
        view.notes.append(CPU_ONLY)
    return view
