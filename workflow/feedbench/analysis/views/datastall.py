"""Study view `datastall`: prep and fetch stalls per model and worker count, the DS-Analyzer way
(VLDB 2021)."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from ..plots import plain
from ..verdict import DATA_STALL_PCT
from . import Table, View, hardware, measured, unfinished

# The least share of a warmed dataset's pages in the page cache for its run to count as fully
# cached.
CACHED_MIN_PCT = 99.0

TEXT = f"""\
Where a training step's time goes when data comes from files, measured the way DS-Analyzer (VLDB \
2021) does: three runs per model and worker count. scenario=compute keeps synthetic data on the \
device: the most the GPU can ingest. scenario=train with page_cache=warm reads real data that is \
fully cached in memory. scenario=train with page_cache=cold reads it from a cold page cache.

Times are per sample (1 / samples per second). Prep stall = cached - compute: the time the CPU \
spends decoding and augmenting beyond what the GPU needs; more loader workers remove it. Fetch \
stall = cold - cached: the time spent reading from storage; workers do not remove it, a faster \
disk or a cache does. Both are shown in microseconds per sample and as a share of the cold run.

A worker count removes the prep stall when the cached run reaches within {DATA_STALL_PCT:g} % of \
the compute ceiling; the verdict names the smallest such count per model (workers per GPU: each \
training process has its own loader). Those counts were measured with one training process: on a \
server whose 8 GPUs share the same CPU cores, 8 loaders compete for them, so the workers one GPU \
needs alone do not carry over to 8.

A run counts as fully cached only where, after warming, at least {CACHED_MIN_PCT:g} % of the \
files' pages were in the page cache (measured with mincore, as fincore does: page_cache_resident); \
below that it would include fetch stalls, and the view leaves it out. The train cells pin their \
batches and copy them with non_blocking, so the host-to-device copy is not counted as prep stall \
(DS-Analyzer's pipeline hands batches over on the device); a pageable synchronous copy would be. \
The models train in fp32 with torchvision (PIL) decoding; DS-Analyzer's runs used mixed precision \
(AMP) and DALI, so its GPUs ingest faster and its CPUs decode faster than these cells."""


def _uncached(rows: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The rows without the warm runs whose files were not (all but) fully resident after warming; a
    note per cell."""
    if "page_cache_resident" not in rows:
        return rows, []
    resident = pd.to_numeric(rows["page_cache_resident"], errors="coerce")
    short = (rows["page_cache"] == "warm") & (resident < CACHED_MIN_PCT / 100)
    notes = [
        f"model={r['model']}, num_workers={r['num_workers']}, repeat {r.get('repeat', '?')}: "
        f"only {100 * float(r['page_cache_resident']):.1f} % of the files' pages were cached "
        f"after warming (less than {CACHED_MIN_PCT:g} %: the dataset does not fit in the page "
        "cache), so this run is not called cached and is left out"
        for r in rows[short].to_dict("records")
    ]
    return rows[~short], notes


def _runs(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Median samples/s of the compute run per model, and of the cached and cold runs per (model,
    num_workers)."""
    ok = measured(rows)
    compute = (
        ok[ok["scenario"] == "compute"].groupby("model")["samples_per_s"].median().rename("compute")
    )
    train = ok[ok["scenario"] == "train"]
    per_cache = (
        train.groupby(["model", "num_workers", "page_cache"])["samples_per_s"]
        .median()
        .unstack("page_cache")
    )
    runs = (
        per_cache.reindex(columns=["warm", "cold"]).rename(columns={"warm": "cached"}).reset_index()
    )
    # A cold run counts only where every repeat really started from a cold cache.
    cold_rows = train[train["page_cache"] == "cold"]
    made = (
        (cold_rows["page_cache_effective"] == "cold")
        .groupby([cold_rows["model"], cold_rows["num_workers"]])
        .all()
        .rename("cold_made")
    )
    runs = runs.merge(made.reset_index(), on=["model", "num_workers"], how="left").merge(
        compute.reset_index(), on="model", how="left"
    )
    return runs.sort_values(["model", "num_workers"], ignore_index=True), cold_rows


def _stalls(runs: pd.DataFrame) -> pd.DataFrame:
    """Per-sample times and the two stalls, absolute and as % of the cold run (no fetch stall where
    no cold cache was made)."""

    def us(column: str) -> pd.Series:
        return 1e6 / runs[column]

    cold = us("cold").where(runs["cold_made"] == True)  # noqa: E712 (NaN where not made)
    out = pd.DataFrame(
        {
            "model": runs["model"],
            "num_workers": runs["num_workers"],
            "compute us/sample": us("compute"),
            "cached us/sample": us("cached"),
            "cold us/sample": cold,
        }
    )
    out["prep stall us/sample"] = out["cached us/sample"] - out["compute us/sample"]
    out["fetch stall us/sample"] = out["cold us/sample"] - out["cached us/sample"]
    out["prep stall % of cold"] = 100 * out["prep stall us/sample"] / out["cold us/sample"]
    out["fetch stall % of cold"] = 100 * out["fetch stall us/sample"] / out["cold us/sample"]
    out["cached % of ceiling"] = 100 * runs["cached"] / runs["compute"]
    return out


def _verdict(stalls: pd.DataFrame) -> str:
    """Per model: the smallest worker count whose cached throughput is within DATA_STALL_PCT of the
    compute ceiling."""
    parts = []
    for model, group in stalls.groupby("model", sort=False):
        known = group.dropna(subset=["cached % of ceiling"])
        enough = known[known["cached % of ceiling"] >= 100 - DATA_STALL_PCT]
        if known.empty:
            parts.append(f"{model}: no cached and compute run pair finished")
        elif len(enough):
            first = enough.iloc[0]
            parts.append(
                f"{model}: {first['num_workers']} workers per GPU remove the prep stall "
                f"(cached run at {first['cached % of ceiling']:.1f} % of the compute ceiling)"
            )
        else:
            best = known.loc[known["cached % of ceiling"].idxmax()]
            counts = ", ".join(str(n) for n in known["num_workers"])
            parts.append(
                f"{model}: none of the measured worker counts ({counts}) removes the prep stall "
                f"(best: {best['num_workers']} workers, {best['cached % of ceiling']:.1f} % of "
                "the ceiling)"
            )
    return "; ".join(parts)


def _cold_notes(cold_rows: pd.DataFrame) -> list[str]:
    """Per model: where the cold cache could not be made, and why (the adjustments); how it was made
    where drop_caches did not."""
    notes = []
    for model, group in cold_rows.groupby("model", sort=False):
        why = (
            "; ".join(dict.fromkeys(str(a) for a in group["adjustments"].dropna()))
            if "adjustments" in group
            else ""
        )
        lost = group[group["page_cache_effective"] != "cold"]
        if len(lost):
            workers = ", ".join(str(n) for n in sorted(set(lost["num_workers"])))
            state = ", ".join(dict.fromkeys(str(s) for s in lost["page_cache_effective"]))
            notes.append(
                f"model={model}, num_workers {workers}: the cold cache could not be made (the "
                f"run started {state})"
                + (f"; the harness says: {why}" if why else "")
                + ". No fetch stall is shown for these: it was not measured."
            )
        elif why:
            notes.append(f"model={model}, cold runs: {why}")
    return notes


def _figure(stalls: pd.DataFrame) -> Figure:
    models = list(dict.fromkeys(stalls["model"]))
    fig = Figure(figsize=(7.5, 3.2 * len(models)), layout="constrained")
    for ax, model in zip(fig.subplots(len(models), 1, squeeze=False)[:, 0], models, strict=True):
        group = stalls[stalls["model"] == model]
        x = range(len(group))
        parts = [
            ("compute us/sample", "compute (ceiling)", "#1f77b4"),
            ("prep stall us/sample", "prep stall", "#ff7f0e"),
            ("fetch stall us/sample", "fetch stall", "#d62728"),
        ]
        bottom = [0.0] * len(group)
        for column, label, colour in parts:
            heights = [max(v, 0.0) if pd.notna(v) else 0.0 for v in group[column]]
            ax.bar(x, heights, bottom=bottom, label=label, color=colour)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.set_xticks(list(x), [str(n) for n in group["num_workers"]])
        ax.set_xlabel("loader workers per GPU")
        ax.set_ylabel("time per sample [us]")
        missing = (
            " (fetch stall not measured: no cold cache)"
            if group["fetch stall us/sample"].isna().all()
            else ""
        )
        ax.set_title(
            plain(f"{model}: compute, prep stall and fetch stall{missing}"), fontsize="medium"
        )
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize="small")
    return fig


def build(rows: pd.DataFrame, reference: pd.DataFrame | None, spec: dict) -> View:
    ours = hardware(rows)
    view = View(
        "datastall",
        TEXT,
        notes=unfinished(rows, ["model", "scenario", "page_cache", "num_workers"]),
    )
    rows, uncached = _uncached(rows)
    view.notes += uncached
    runs, cold_rows = _runs(rows)
    stalls = _stalls(runs)
    view.notes += _cold_notes(cold_rows)
    if runs.empty:
        view.notes.insert(0, "no train cell of this experiment finished: nothing to show")
    for model in runs.loc[runs["compute"].isna(), "model"].unique():
        view.notes.append(
            f"model={model}: no compute cell finished, so there is no ceiling and no prep stall"
        )
    view.tables.append(
        Table.of(stalls, f"Measured on {ours}: median over repeats, microseconds per sample")
    )
    if reference is not None:
        view.tables.append(Table.of(reference, "Published: on the hardware of each row"))
    view.verdict = _verdict(stalls) or None
    view.figure = _figure(stalls) if len(stalls) else None
    return view
