"""Study view `scaling`: ResNet-50 data-parallel throughput against GPUs and nodes
(pytorch_throughput; docs/studies.md)."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from ..plots import plain
from . import Table, View, hardware, measured, unfinished, with_gpus

KEYS = ["gpus", "nodes", "parallel"]

TEXT = """\
Throughput of data-parallel training against the number of GPUs and nodes, as pytorch_throughput \
measured ResNet-50 (32 synthetic images per GPU, data already on the GPU): overall samples/s, the \
speedup over the experiment's one-GPU cell and the scaling efficiency (speedup / GPUs, 1 = the \
ideal line). DataParallel runs in one process on one node, DDP one process per GPU across nodes.

Speedups and efficiencies compare across machines; samples/s do not, so each absolute number \
carries the hardware it was measured on. The published numbers come from K80 GPUs on AWS \
p2.8xlarge instances.

Forward and backward throughput: ours from CUDA events (fwd = batch / median fwd time, bwd = batch \
/ median (backward + optimizer) time, batch = per-GPU batch x GPUs). The original timed them with \
time.time() and no synchronisation, so its split is not meaningful (only the sum holds); \
timing=naive cells, when the experiment has them, reproduce that method beside ours, with the \
original's own estimators where the cell is the original's (DataParallel in one process): fwd and \
bwd as the mean of per-step rates after the first step, overall samples/s as steps x batch over \
the host wall time with no final synchronisation."""


def _cells(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (timing, GPUs, nodes, parallel): medians over the finished repeats, with fwd/bwd
    throughput per repeat."""
    ok = with_gpus(measured(rows))
    ok = ok.assign(
        nodes=ok["nodes"].where(ok["parallel"].isin(["ddp", "independent"]), 1).astype(int),
        fwd_samples_per_s=1000 * ok["batch_size"] * ok["gpus"] / ok["fwd_ms"],
        bwd_samples_per_s=1000 * ok["batch_size"] * ok["gpus"] / (ok["bwd_ms"] + ok["opt_ms"]),
    )
    # The naive cells that reproduce the original (one process: none or dp) use its own estimators
    # where recorded.
    original = (ok["timing"] == "naive") & ok["parallel"].isin(["none", "dp"])
    for column in ("samples_per_s", "fwd_samples_per_s", "bwd_samples_per_s"):
        if f"original_{column}" in ok:
            theirs = pd.to_numeric(ok[f"original_{column}"], errors="coerce")
            ok[column] = ok[column].where(~original | theirs.isna(), theirs)
    values = ["samples_per_s", "fwd_samples_per_s", "bwd_samples_per_s"]
    return (
        ok.groupby(["timing", *KEYS])[values]
        .median()
        .reset_index()
        .sort_values(["timing", *KEYS], ignore_index=True)
    )


def _with_speedup(cells: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """Speedup over the one-GPU cell (parallel=none first when there are several) and efficiency =
    speedup / GPUs."""
    ones = cells[cells["gpus"] == 1].sort_values(
        "parallel", key=lambda p: p != "none", kind="stable"
    )
    if ones.empty:
        return cells.assign(speedup=None, efficiency=None), None
    base = ones.iloc[0]
    speedup = cells["samples_per_s"] / base["samples_per_s"]
    return cells.assign(
        speedup=speedup, efficiency=speedup / cells["gpus"]
    ), f"parallel={base['parallel']}"


def _figure(
    cells: pd.DataFrame, base_label: str | None, reference: pd.DataFrame | None, ours: str
) -> Figure:
    fig = Figure(figsize=(7.5, 10), layout="constrained")
    throughput, speedup, efficiency = fig.subplots(3, 1)
    gpus = sorted(
        set(cells["gpus"]) | (set(reference["gpus"]) if reference is not None else set()) | {1}
    )
    for parallel, group in cells.groupby("parallel", sort=False):
        measured = dict(marker="o", label=f"measured, parallel={parallel}")
        throughput.plot(group["gpus"], group["samples_per_s"], **measured)
        if base_label:
            speedup.plot(group["gpus"], group["speedup"], **measured)
            efficiency.plot(group["gpus"], group["efficiency"], **measured)
    if base_label:
        base = cells.loc[cells["speedup"] == 1, "samples_per_s"].iloc[0]
        measured_gpus = sorted(set(cells["gpus"]))
        throughput.plot(
            measured_gpus,
            [base * g for g in measured_gpus],
            "k--",
            label="ideal (one-GPU cell x GPUs)",
        )
    if reference is not None:
        published = dict(marker="s", linestyle=":", label="published (K80)")
        speedup.plot(reference["gpus"], reference["speedup"], **published)
        efficiency.plot(reference["gpus"], reference["speedup"] / reference["gpus"], **published)
    speedup.plot(gpus, gpus, "k--", label="ideal")
    efficiency.plot(gpus, [1.0] * len(gpus), "k--", label="ideal")
    throughput.set_title(plain(f"measured throughput on {ours}"), fontsize="medium")
    throughput.set_ylabel("samples/s")
    speedup.set_ylabel("speedup over 1 GPU")
    efficiency.set_ylabel("efficiency (speedup / GPUs)")
    speedup.set_yscale("log", base=2)
    speedup.set_yticks(gpus, [str(g) for g in gpus])
    efficiency.set_ylim(0, 1.1)
    for ax in (throughput, speedup, efficiency):
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [str(g) for g in gpus])
        ax.set_xlabel("GPUs")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return fig


def _measured_table(main: pd.DataFrame, ours: str, base_label: str | None) -> Table:
    return Table.of(
        main[[*KEYS, "samples_per_s", "speedup", "ideal_speedup", "efficiency"]].rename(
            columns={"gpus": "GPUs", "samples_per_s": "samples/s", "ideal_speedup": "ideal speedup"}
        ),
        f"Measured on {ours}: median over repeats; speedup over the one-GPU cell ("
        f"{base_label or 'none finished'})",
    )


def _split(
    main: pd.DataFrame, naive: pd.DataFrame, timing: str, ours: str
) -> tuple[Table, list[str]]:
    """Forward and backward throughput at `timing` beside the naive cells' (the original's
    unsynchronised split), and a note where the naive side is missing or is all there is."""
    split = main[[*KEYS, "fwd_samples_per_s", "bwd_samples_per_s"]].rename(
        columns={
            "fwd_samples_per_s": f"fwd samples/s ({timing})",
            "bwd_samples_per_s": f"bwd samples/s ({timing})",
        }
    )
    notes = []
    if len(naive):
        split = split.merge(
            naive[[*KEYS, "fwd_samples_per_s", "bwd_samples_per_s", "samples_per_s"]].rename(
                columns={
                    "fwd_samples_per_s": "fwd samples/s (naive)",
                    "bwd_samples_per_s": "bwd samples/s (naive)",
                    "samples_per_s": "overall samples/s (naive)",
                }
            ),
            on=KEYS,
            how="outer",
        )
    elif timing == "naive":
        notes.append(
            "every cell ran with timing=naive: like the original's, this fwd/bwd split is "
            "unsynchronised and not meaningful"
        )
    else:
        notes.append(
            "no timing=naive cell in this experiment: the original's unsynchronised fwd/bwd "
            "split is not reproduced"
        )
    table = Table.of(
        split.rename(columns={"gpus": "GPUs"}),
        f"Forward and backward throughput measured on {ours}: timing={timing} (batch / median "
        "phase time) beside unsynchronised host timing (naive: the original's mean of per-step "
        "rates where recorded)",
    )
    return table, notes


def _published_tables(main: pd.DataFrame, reference: pd.DataFrame) -> list[Table]:
    """Speedup and efficiency measured beside published, then the published table itself."""
    published = reference.assign(efficiency=reference["speedup"] / reference["gpus"])
    side = main[["gpus", "parallel", "speedup", "efficiency"]].merge(
        published[["gpus", "parallel", "speedup", "efficiency"]],
        on="gpus",
        how="outer",
        suffixes=(" measured", " published"),
    )
    return [
        Table.of(
            side.rename(columns={"gpus": "GPUs"}),
            "Speedup and efficiency side by side, measured and published (these compare across "
            "machines)",
        ),
        Table.of(
            published.rename(columns={"efficiency": "efficiency (speedup / gpus)"}),
            f"Published: {', '.join(dict.fromkeys(reference['source']))}, each number on the "
            "hardware of its row",
        ),
    ]


def _verdict(main: pd.DataFrame, reference: pd.DataFrame | None) -> str:
    """Speedup and efficiency at the most GPUs measured, beside the published ones at as many
    GPUs."""
    top = main.sort_values(["gpus", "speedup"]).iloc[-1]
    text = (
        f"at {top['gpus']} GPUs ({top['parallel']}, {top['nodes']} node(s)) the measured speedup "
        f"is {top['speedup']:.2f}x, efficiency {top['efficiency']:.0%}"
    )
    if reference is not None and (reference["gpus"] == top["gpus"]).any():
        pub = reference[reference["gpus"] == top["gpus"]].iloc[0]
        text += (
            f"; published on {pub['hardware']}: {pub['speedup']:.2f}x, "
            f"{pub['speedup'] / pub['gpus']:.0%}"
        )
    return text[0].upper() + text[1:]


def build(rows: pd.DataFrame, reference: pd.DataFrame | None, spec: dict) -> View:
    ours = hardware(rows)
    view = View(
        "scaling", TEXT, notes=unfinished(rows, ["gpus_per_node", "nodes", "parallel", "timing"])
    )
    cells = _cells(rows)
    # The table's numbers come from one timing mode (events, else sync, else naive); naive cells go
    # beside them in the split.
    timing = next(
        (t for t in ("events", "sync", "naive") if (cells["timing"] == t).any()), "events"
    )
    main, base_label = _with_speedup(
        cells[cells["timing"] == timing].drop(columns="timing").reset_index(drop=True)
    )
    naive = cells[cells["timing"] == "naive"] if timing != "naive" else cells.iloc[0:0]
    if not len(main):
        view.notes.insert(0, "no cell of this experiment finished: nothing to show")
    elif base_label is None:
        view.notes.insert(
            0, "no one-GPU cell finished: speedups and efficiencies cannot be computed"
        )
    main = main.assign(ideal_speedup=main["gpus"].astype(float))
    view.tables.append(_measured_table(main, ours, base_label))
    split, notes = _split(main, naive, timing, ours)
    view.notes += notes
    view.tables.append(split)
    if reference is None:
        view.notes.append("no published table: the measured numbers stand alone")
    else:
        view.tables += _published_tables(main, reference)
    if base_label is not None:
        view.verdict = _verdict(main, reference)
    view.figure = _figure(main, base_label, reference, ours) if len(main) else None
    return view
