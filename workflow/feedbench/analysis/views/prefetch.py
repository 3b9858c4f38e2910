"""Study view `prefetch`: time with and without the stream prefetcher per epochs x hidden layers
(Ray's auto pipeline; docs/studies.md)."""

from __future__ import annotations

import itertools

import pandas as pd
from matplotlib.figure import Figure

from ..aggregate import as_requested, is_true
from ..plots import plain
from . import Table, View, common_notes, cpu_only, hardware, median_by, unfinished

KEYS = ["epochs", "hidden_layers"]

TEXT = """\
Ray's example trains an MLP (hidden_layers square Linear(4096, 4096) layers and a one-unit output, \
no activation: mlp_style=ray) on 50 batches of 4096 synthetic samples per epoch and times all \
epochs with and without its auto pipeline, which copies batch k+1 to the GPU on a side stream \
while batch k computes. Here each cell times the same epochs after warm-up (window_s, the median \
of the repeats); speedup = time without the prefetcher / time with it.

The original's source is pageable memory, so its non_blocking copies block the host and overlap \
little: that is why it gains only a few per cent. The cells with pin_memory=true feed the \
prefetcher from pinned memory, where the copy can run beside the compute: they show what the \
overlap is worth.

Times belong to the machine they were measured on (each table names it); speedups compare across \
machines."""


def _source(pin) -> str:
    return "pinned" if is_true(pin) else "pageable"


def _ours(rows: pd.DataFrame, others: list[str]) -> pd.DataFrame:
    """Median window time per (source, epochs, hidden layers, other knobs of the matrix) without and
    with the prefetcher."""
    rows = as_requested(rows, ["pin_memory", "device_prefetch"])
    rows = rows.assign(source=[_source(p) for p in rows["pin_memory"]])
    times = median_by(rows, ["source", *KEYS, *others, "device_prefetch"], ["window_s"])
    wide = (
        times.set_index(["source", *KEYS, *others, "device_prefetch"])["window_s"]
        .astype(float)
        .unstack("device_prefetch")
    )
    wide = (
        wide.reindex(columns=["none", "stream"])
        .reset_index()
        .rename(columns={"none": "without_s", "stream": "with_s"})
    )
    # epochs is empty when a cell counts steps
    wide[KEYS] = wide[KEYS].apply(pd.to_numeric).astype("Int64")
    return wide.assign(speedup=wide["without_s"] / wide["with_s"])


def _published(reference: pd.DataFrame) -> pd.DataFrame:
    wide = reference.pivot_table(
        index=KEYS, columns="device_prefetch", values="seconds", aggfunc="first"
    ).reset_index()
    wide = wide.rename(columns={"none": "without_s", "stream": "with_s"})
    return wide.assign(speedup=wide["without_s"] / wide["with_s"])


def _published_trend(theirs: pd.DataFrame) -> list[str]:
    """Where the published speedup falls as layers are added: the source says the gain grows with
    model size."""
    notes = []
    for epochs, group in theirs.sort_values(KEYS).groupby("epochs"):
        speedups = list(group["speedup"])
        if len(speedups) > 1 and all(a > b for a, b in itertools.pairwise(speedups)):
            listed = ", ".join(f"{s:.3f}" for s in speedups)
            layers = ", ".join(str(h) for h in group["hidden_layers"])
            notes.append(
                f"The published speedup at {epochs} epoch(s) falls as layers are added ({listed} "
                f"at {layers} hidden layers), although the source says the auto pipeline gains "
                "more as the model grows: a larger model leaves the copy a smaller share of "
                "each step to hide."
            )
    return notes


def _figure(side: pd.DataFrame, series: dict[str, str]) -> Figure:
    """Speedup per hidden layers, one axes per epochs: the published bars beside ours."""
    epochs = list(side["epochs"].drop_duplicates())
    fig = Figure(figsize=(3.2 * max(len(epochs), 1) + 1, 4.0), layout="constrained")
    axes = fig.subplots(1, max(len(epochs), 1), sharey=True, squeeze=False)[0]
    for ax, n in zip(axes, epochs, strict=False):  # no epochs: one empty panel, nothing to draw
        part = side[side["epochs"].eq(n) if not pd.isna(n) else side["epochs"].isna()]
        width = 0.8 / len(series)
        for i, (column, label) in enumerate(series.items()):
            # bars grow from 1 (no gain): up is faster with the prefetcher
            gain = part[column].astype(float) - 1.0
            offsets = [j + (i - (len(series) - 1) / 2) * width for j in range(len(part))]
            ax.bar(offsets, gain, bottom=1.0, width=width, label=plain(label))
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(part)), [str(h) for h in part["hidden_layers"]])
        ax.set_xlabel("hidden layers")
        ax.set_title(f"epochs = {n if not pd.isna(n) else 'steps'}", fontsize="medium")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("speedup (without / with prefetch)")
    fig.legend(
        *axes[0].get_legend_handles_labels(),
        loc="outside lower center",
        ncols=len(series),
        fontsize="small",
    )
    return fig


def build(rows: pd.DataFrame, reference: pd.DataFrame | None, spec: dict) -> View:
    others = [
        k
        for k in spec.get("matrix") or {}
        if k not in (*KEYS, "pin_memory", "device_prefetch") and k in rows
    ]
    ours = _ours(rows, others)
    here = hardware(rows)
    view = View(
        "prefetch",
        TEXT,
        notes=common_notes(rows, reference, spec, "prefetch")
        + unfinished(rows, [*KEYS, "device_prefetch", "pin_memory"]),
    )
    view.tables.append(
        Table.of(
            ours.rename(
                columns={
                    "without_s": "time without prefetch [s]",
                    "with_s": "time with stream prefetch [s]",
                }
            ),
            f"Measured on {here}: median time of the measured epochs (window_s) and speedup",
        )
    )
    side = (
        ours.set_index([*KEYS, *others, "source"])["speedup"]
        .unstack("source")
        .reindex(columns=["pageable", "pinned"])
        .reset_index()
    )
    side = side.rename(
        columns={"pageable": "measured, pageable source", "pinned": "measured, pinned source"}
    )
    series = {
        "measured, pageable source": f"ours, pageable source ({here})",
        "measured, pinned source": f"ours, pinned source ({here})",
    }
    theirs = None
    if reference is not None:
        theirs = _published(reference)
        where = ", ".join(reference["hardware"].astype(str).unique())
        view.tables.append(
            Table.of(
                theirs.rename(
                    columns={
                        "with_s": "time with auto pipeline [s]",
                        "without_s": "time without [s]",
                    }
                ),
                f"Published ({', '.join(reference['source'].astype(str).unique())}) on {where}: "
                "time of all epochs, one run each",
            )
        )
        side = (
            theirs[[*KEYS, "speedup"]]
            .rename(columns={"speedup": f"published ({where})"})
            .merge(side, on=KEYS, how="outer")
        )
        series = {f"published ({where})": f"published ({where})", **series}
        view.notes += _published_trend(theirs)
    side = side.sort_values([*KEYS, *others], ignore_index=True)
    view.tables.insert(
        0,
        Table.of(
            side,
            "Speedup of the stream prefetcher (time without / time with), published "
            "and measured side by side",
        ),
    )
    if side[list(series)].notna().any().any():
        view.figure = _figure(side, series)
    _verdict_and_notes(view, ours, theirs, rows)
    return view


def _verdict_and_notes(
    view: View, ours: pd.DataFrame, theirs: pd.DataFrame | None, rows: pd.DataFrame
) -> None:
    """The verdict from the measured speedups (beside the published ones), and what the cells cannot
    show."""
    measured_speedups = ours.dropna(subset=["speedup"])
    if len(measured_speedups):
        ranges = [
            f"{lo:.2f}{f'–{hi:.2f}' if f'{hi:.2f}' != f'{lo:.2f}' else ''}× from a {source} source"
            for source, (lo, hi) in measured_speedups.groupby("source")["speedup"]
            .agg(["min", "max"])
            .iterrows()
        ]
        published = (
            f" (published: {theirs['speedup'].min():.2f}–{theirs['speedup'].max():.2f}×)"
            if theirs is not None
            else ""
        )
        view.verdict = (
            "The stream prefetcher speeds the measured epochs up "
            f"{' and '.join(ranges)}{published}."
        )
    if not (ours["source"] == "pinned").any() and len(ours):
        view.notes.append(
            "No pin_memory=true cell: the pinned-source speedup, where the overlap really pays, "
            "is not measured."
        )
    if cpu_only(rows):
        view.notes.append(
            "Every cell ran on the CPU (no GPU in the results): the stream prefetcher and "
            "pinning are pass-throughs there, so these speedups say nothing about overlapping "
            "copies with compute."
        )
