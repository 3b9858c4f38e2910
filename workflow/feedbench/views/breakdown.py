"""Study view `breakdown`: load / transfer / processing per batch for pinning x non_blocking under each timing mode (forum post, STUDIES.md section 5)."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from ..labels import cell_label
from ..plots import PHASE_COLOURS, fit_ticks, plain, slot
from . import Table, View, as_requested, common_notes, cpu_only, hardware, median_by, unfinished

# The post's three parts of a batch, each the sum of our phases named in the module's TEXT.
PARTS = {"load_ms": ("load", PHASE_COLOURS["wait"]), "transfer_ms": ("transfer", PHASE_COLOURS["h2d"]),
          "processing_ms": ("processing", PHASE_COLOURS["fwd"])}
TIMINGS = {"events": "CUDA events, no host sync", "sync": "sync at each phase", "naive": "host clock, no sync"}
KEYS = ["timing", "pin_memory", "non_blocking"]

TEXT = """\
The forum post split each batch into loading (the trainer waiting for the DataLoader), transfer (the .cuda() calls) \
and processing (forward, loss, backward, update), and was surprised by how the three moved when it turned pin_memory \
and non_blocking off. Here load = wait_ms, transfer = h2d_ms and processing = fwd_ms + bwd_ms + opt_ms, medians per \
step over the measured window and the repeats.

The same cells are shown under the three timing modes side by side: events reads CUDA events after the window \
(what the GPU spent, without making the host wait), sync synchronises at every phase boundary (the post's \
follow-up), naive reads the host clock with no synchronisation (how the post timed). Where naive and events \
disagree, the naive split is an artefact of asynchronous CUDA, not a cost.

The post's statements are listed with the explanation of each; it published no number (its tables are in a linked \
report), so the published table is what it said, beside what we measure for the same case."""

EXPLAIN = {
    "Q1": "Host clocks without synchronisation time kernel launches, not kernels: the GPU's work is paid wherever the host "
          "next waits for it (a blocking copy, loss.item()), possibly in another phase or step. Per-phase times taken that "
          "way do not compare between 1 and 4 GPUs; CUDA events do.",
    "Q2": "A copy from pageable memory is staged by the driver through a pinned buffer and the host waits for it: "
          "non_blocking=True has no effect there. Compare the pin_memory=false bars with non_blocking on and off.",
    "Q3": "The blocking copy from pageable memory waits for the GPU work queued before it (the previous backward and "
          "update), so that time is counted as transfer and leaves processing. Loading rises because with pin_memory=True "
          "a thread of the main process takes each batch off the workers' queue and pins it while the trainer computes; "
          "with it off, the trainer unpacks each batch inside next(), in the loading time.",
    "follow-up": "The author's reading is right: with pinned memory and non_blocking the copy returns at once and its cost lands in processing. "
                 "Synchronising after .cuda() (timing=sync) moves it back to transfer, at the price of the overlap; "
                 "CUDA events (timing=events) split the phases without making the host wait.",
}


def _flag(value) -> bool:
    return value is True or str(value).lower() == "true"


def _phases(rows: pd.DataFrame, others: list[str]) -> pd.DataFrame:
    """Median load, transfer, processing and step ms per (timing, pin_memory, non_blocking, other knobs), timings in TIMINGS order."""
    rows = as_requested(rows, KEYS)
    numbers = {c: pd.to_numeric(rows[c], errors="coerce") for c in ("wait_ms", "h2d_ms", "fwd_ms", "bwd_ms", "opt_ms")}
    rows = rows.assign(load_ms=numbers["wait_ms"], transfer_ms=numbers["h2d_ms"],
                       processing_ms=numbers["fwd_ms"] + numbers["bwd_ms"] + numbers["opt_ms"],
                       pin_memory=[_flag(v) for v in rows["pin_memory"]], non_blocking=[_flag(v) for v in rows["non_blocking"]])
    table = median_by(rows, [*KEYS, *others], [*PARTS, "step_ms_median"])
    order = {t: i for i, t in enumerate(TIMINGS)}
    return table.sort_values("timing", key=lambda t: t.map(order), kind="stable", ignore_index=True)


def _figure(table: pd.DataFrame, others: list[str], here: str) -> Figure:
    timings = list(table["timing"].drop_duplicates())
    fig = Figure(figsize=(3.4 * len(timings) + 1, 4.4), layout="constrained")
    axes = fig.subplots(1, len(timings), sharey=True, squeeze=False)[0]
    for ax, timing in zip(axes, timings):
        part = table[table["timing"] == timing]
        bottom = pd.Series(0.0, index=part.index)
        for column, (label, colour) in PARTS.items():
            height = part[column].astype(float).fillna(0.0)
            ax.bar(range(len(part)), height, bottom=bottom, color=colour, label=label)
            bottom = bottom + height
        shown = [k for k in ("pin_memory", "non_blocking", *others) if part[k].astype(str).nunique() > 1]
        labels = [plain(cell_label(r, shown)) for r in part.to_dict("records")]  # short: `pin nb gpus=2`
        fit_ticks(ax, range(len(part)), labels, slot(ax, len(part)))
        ax.set_title(f"{timing}: {TIMINGS.get(timing, '')}", fontsize="medium")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("median ms per step")
    fig.suptitle(plain(f"Measured on {here}"), fontsize="medium")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=len(PARTS), fontsize="small")
    return fig


def build(rows: pd.DataFrame, reference: pd.DataFrame | None, spec: dict) -> View:
    others = [k for k in spec.get("matrix") or {} if k not in KEYS and k in rows]
    table = _phases(rows, others)
    here = hardware(rows)
    view = View("breakdown", TEXT, notes=common_notes(rows, reference, spec, "breakdown") + unfinished(rows, [*KEYS, *others]))
    view.tables.append(Table.of(table.rename(columns={"load_ms": "load [ms]", "transfer_ms": "transfer [ms]", "processing_ms": "processing [ms]",
                                                      "step_ms_median": "step [ms]"}),
                                f"Measured on {here}: median ms per step of each phase, per timing mode"))
    if reference is not None:
        where = ", ".join(reference["hardware"].astype(str).unique())
        said = reference.assign(pin_memory=[_flag(v) for v in reference["pin_memory"]], non_blocking=[_flag(v) for v in reference["non_blocking"]],
                                explanation=reference["item"].map(EXPLAIN).where(~reference["item"].duplicated()))
        pooled = f" (median over {', '.join(others)})" if others else ""
        # Our number for the statement's case, at its timing and with CUDA events.
        at = table.groupby(KEYS)[list(PARTS)].median()
        said["measured at this timing [ms]"] = [at[f"{p}_ms"].get((t, pin, nb)) if f"{p}_ms" in at else None
                                               for t, pin, nb, p in said[[*KEYS, "phase"]].itertuples(index=False)]
        said["measured with events [ms]"] = [at[f"{p}_ms"].get(("events", pin, nb)) if f"{p}_ms" in at else None
                                             for pin, nb, p in said[["pin_memory", "non_blocking", "phase"]].itertuples(index=False)]
        view.tables.insert(0, Table.of(
            said[["item", "gpus", "batch_size", *KEYS, "phase", "reported", "measured at this timing [ms]", "measured with events [ms]", "explanation"]],
            f"Published ({', '.join(reference['source'].astype(str).unique())}, {where}): what the post reported, our measurement with the same pinning, "
            f"non_blocking and timing on {here}{pooled}, and why"))
    if len(table):
        view.figure = _figure(table, others, here)
        trusted = table[table["timing"] == "events"] if (table["timing"] == "events").any() else table[table["timing"] == "sync"]
        if len(trusted) and trusted["step_ms_median"].notna().any():
            best = trusted.loc[trusted["step_ms_median"].astype(float).idxmin()]
            view.verdict = (f"Shortest step, timed with {best['timing']}: pin_memory={str(best['pin_memory']).lower()}, "
                            f"non_blocking={str(best['non_blocking']).lower()} ({best['step_ms_median']:.1f} ms: load {best['load_ms']:.1f}, "
                            f"transfer {best['transfer_ms']:.1f}, processing {best['processing_ms']:.1f}).")
        missing = [t for t in TIMINGS if t not in set(table["timing"])]
        if missing:
            view.notes.append(f"No cells with timing={', '.join(missing)}: the side-by-side comparison of timing modes is incomplete.")
    if cpu_only(rows):
        view.notes.append("Every cell ran on the CPU (no GPU in the results): the three timing modes read the same host clock and pinning and "
                          "non_blocking do nothing, so the post's surprises cannot appear here; they need a GPU.")
    return view
