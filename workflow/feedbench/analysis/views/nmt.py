"""Study view `nmt`: fused vs step-by-step LSTM under DataParallel, DDP and independent replicas
(TensorFlow NMT; docs/studies.md)."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from . import Table, View, hardware, measured, unfinished, with_gpus

VARIANT = ["lstm_impl", "parallel"]
KEYS = [*VARIANT, "gpus"]
FIXED = "speedup published (warm-up fix, batch 384)"
PARALLEL = {"dp": "DataParallel", "ddp": "DDP", "independent": "independent", "none": "one process"}

TEXT = """\
Tokens per second of an LSTM sequence model and its speedup over the same variant's one-GPU cell, \
at each GPU count, for the four corners the TensorFlow NMT study compared: the fused cuDNN LSTM \
(lstm_impl=fused) against a step-by-step LSTMCell loop (lstm_impl=cell), under DataParallel \
(parallel=dp: one process, parameters broadcast and gradients reduced onto the first GPU, the loss \
computed inside each replica; the study used a TensorFlow parameter server, which DataParallel is \
not), DDP (all-reduce of gradients: parallel=ddp) and independent replicas with no gradient \
exchange (parallel=independent: the ideal line).

The gap between a variant and its independent replicas is what gradient exchange costs; the gap \
between fused and cell is what a step-by-step RNN costs. Speedups compare across machines, \
tokens/s do not: the published words/s come from TensorFlow on one machine with 8 Tesla \
P100-PCIE-16GB (the study's README), ours from the hardware in the table's caption. The study's \
first tables (batch 360) timed a first batch that included memory-pool allocation; its later \
re-measurement (docs/fix_the_warmup_problem.md: 10 warm-up batches, batch 384 per GPU) is shown in \
its own column: at 8 GPUs independent cudnn_lstm 7.59x, cudnn_lstm + parameter server 6.44x, \
dynamic_rnn + parameter server 6.42x, dynamic_rnn + NCCL all-reduce 4.89x."""


def _cells(rows: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Median metric per (lstm_impl, parallel, GPUs) and the speedup over the variant's one-GPU
    cell.

    A variant without a one-GPU cell of its own (DDP and independent replicas of one GPU are one
    plain process) is compared with the same lstm_impl's one-GPU cell with parallel=none.
    """
    ok = with_gpus(measured(rows))
    cells = (
        ok.groupby(KEYS)[metric]
        .median()
        .rename("value")
        .reset_index()
        .sort_values(KEYS, ignore_index=True)
    )
    one = cells[cells["gpus"] == 1]
    own = one.set_index(VARIANT)["value"]
    plain = one[one["parallel"] == "none"].set_index("lstm_impl")["value"]
    base = [
        own.get((impl, par), plain.get(impl))
        for impl, par in zip(cells["lstm_impl"], cells["parallel"], strict=True)
    ]
    cells["speedup"] = cells["value"] / pd.Series(base, index=cells.index, dtype=float)
    cells["efficiency"] = cells["speedup"] / cells["gpus"]
    return cells


def _figure(cells: pd.DataFrame, reference: pd.DataFrame | None) -> Figure:
    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.subplots()
    colours = {}
    for (impl, par), group in cells[cells["speedup"].notna()].groupby(VARIANT, sort=False):
        (line,) = ax.plot(
            group["gpus"],
            group["speedup"],
            marker="o",
            label=f"measured {impl}, {PARALLEL.get(par, par)}",
        )
        colours[(impl, par)] = line.get_color()
    if reference is not None:
        published = reference[(reference["warmup_steps"] == 0) & reference["speedup"].notna()]
        for (impl, par), group in published.groupby(VARIANT, sort=False):
            ax.plot(
                group["gpus"],
                group["speedup"],
                marker="s",
                linestyle=":",
                color=colours.get((impl, par)),
                alpha=0.8,
                label=f"published {impl}, {PARALLEL.get(par, par)}",
            )
    gpus = sorted(
        set(cells["gpus"]) | (set(reference["gpus"]) if reference is not None else set()) | {1}
    )
    ax.plot(gpus, gpus, "k--", label="ideal")
    ax.set_xticks(gpus, [str(g) for g in gpus])
    ax.set_xlabel("GPUs")
    ax.set_ylabel("speedup over the variant's 1 GPU")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2)
    return fig


def build(rows: pd.DataFrame, reference: pd.DataFrame | None, spec: dict) -> View:
    ours = hardware(rows)
    ok = measured(rows)
    metric = (
        "tokens_per_s"
        if "tokens_per_s" in ok and ok["tokens_per_s"].notna().any()
        else "samples_per_s"
    )
    unit = metric.replace("_per_s", "/s")
    view = View(
        "nmt", TEXT, notes=unfinished(rows, ["lstm_impl", "parallel", "gpus_per_node", "nodes"])
    )
    cells = _cells(rows, metric)
    if cells.empty:
        view.notes.insert(0, "no cell of this experiment finished: nothing to show")
    elif cells["speedup"].isna().any():
        lost = cells.loc[cells["speedup"].isna(), VARIANT].drop_duplicates()
        view.notes.append(
            "no speedup for "
            + "; ".join(f"lstm_impl={i}, parallel={p}" for i, p in lost.itertuples(index=False))
            + ": no one-GPU cell of that variant (nor of parallel=none) finished"
        )
    view.tables.append(
        Table.of(
            cells.rename(columns={"gpus": "GPUs", "value": unit}),
            f"Measured on {ours}: median {unit} over repeats, speedup over the variant's one-GPU "
            "cell",
        )
    )

    if reference is None:
        view.notes.append("no published table: the measured numbers stand alone")
    else:
        original = reference[reference["warmup_steps"] == 0][KEYS + ["speedup"]]
        fixed = reference[reference["warmup_steps"] > 0][KEYS + ["speedup"]].rename(
            columns={"speedup": FIXED}
        )
        side = (
            cells[KEYS + ["speedup", "efficiency"]]
            .merge(
                original.assign(efficiency=original["speedup"] / original["gpus"]),
                on=KEYS,
                how="outer",
                suffixes=(" measured", " published"),
            )
            .merge(fixed, on=KEYS, how="left")
            .sort_values(KEYS, ignore_index=True)
        )
        view.tables.append(
            Table.of(
                side.rename(columns={"gpus": "GPUs"}),
                "Speedup and efficiency side by side, measured and published, per variant and "
                "GPU count",
            )
        )
        view.tables.append(
            Table.of(
                reference, "Published: TensorFlow NMT (dl_framework), on the hardware of each row"
            )
        )

    measured_speedups = cells[cells["speedup"].notna()]
    if len(measured_speedups):
        top = measured_speedups[
            measured_speedups["gpus"] == measured_speedups["gpus"].max()
        ].sort_values("speedup", ascending=False)
        ranking = ", ".join(
            f"{i}/{PARALLEL.get(p, p)} {s:.2f}x"
            for i, p, s in top[["lstm_impl", "parallel", "speedup"]].itertuples(index=False)
        )
        view.verdict = f"Speedup at {top['gpus'].iloc[0]} GPUs, best first: {ranking}"
    view.figure = _figure(cells, reference) if len(cells) else None
    return view
