"""Study view `workers`: steady-state samples/s per loader worker count beside the time to the first
batch (CIFAR-100 notebook; docs/studies.md)."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from ..plots import plain
from . import Table, View, common_notes, cpu_only, hardware, median_by, unfinished

TEXT = """\
The CIFAR-100 notebook profiled one window per worker count: next() on a DataLoader iterator it \
had already created (enumerate() runs before profile(), so the workers were started outside the \
window) and the .to(device) of that batch. In its first run (1 worker) that first .to() also \
created the CUDA context: the profiler put 5.338 s of the run's 5.366 s in aten::to. Its "300x" \
from 1 to 8 workers is therefore CUDA context creation, not loading.

Ours is a different first-batch measurement: the time from creating the loader to its first batch, \
which includes starting the workers and excludes CUDA context creation (made before, and timed on \
its own: cuda_init_s). The two first-batch speedups are shown side by side but do not measure the \
same thing; neither is what a training run gets. samples/s and the time per batch come from the \
steady state after warm-up: that is the number to choose workers by. Cells with \
profile_first_batch=true also repeat the notebook's own window (next() and .to() under the \
profiler, the workers started before it), with the CUDA context already made: at 1 worker the \
notebook's number is that plus cuda_init_s.

Times and samples/s belong to the machine they were measured on; the speedups over the baseline \
worker count compare across machines."""


def _relative(
    frame: pd.DataFrame, column: str, others: list[str], base: int, faster_is_higher: bool
) -> pd.Series:
    """Each row's speedup over the row with num_workers == base among those with the same other
    knobs."""
    at_base = frame[column].where(frame["num_workers"] == base)
    reference = (
        at_base.groupby([frame[k] for k in others], dropna=False).transform("max")
        if others
        else at_base.max()
    )
    return frame[column] / reference if faster_is_higher else reference / frame[column]


def _baseline(counts) -> int | None:
    counts = sorted(set(counts))
    return 1 if 1 in counts else (counts[0] if counts else None)


def _figure(
    ours: pd.DataFrame, others: list[str], theirs: pd.DataFrame | None, here: str, where: str
) -> Figure:
    fig = Figure(figsize=(9, 4.6), layout="constrained")
    steady, first = fig.subplots(1, 2)
    groups = list(ours.groupby(others, dropna=False)) if others else [((), ours)]
    for values, group in groups:
        values = values if isinstance(values, tuple) else (values,)
        label = plain(", ".join(f"{k}={v}" for k, v in zip(others, values, strict=True)) or "ours")
        steady.plot(group["num_workers"], group["samples_per_s"], marker="o", label=label)
        first.plot(
            group["num_workers"],
            group["first_batch_ms"],
            marker="o",
            label=f"ours: loader creation to first batch, {label}",
        )
    if ours["cuda_init_ms"].notna().any():
        first.plot(
            ours["num_workers"],
            ours["cuda_init_ms"],
            marker="x",
            linestyle="none",
            color="black",
            label="CUDA init, apart",
        )
    if theirs is not None:
        first.plot(
            theirs["num_workers"],
            theirs["data_load_ms"],
            marker="s",
            linestyle="--",
            color="grey",
            label=plain(f"published: next() + .to() under the profiler ({where})"),
        )
    steady.set_title(plain(f"steady state ({here})"), fontsize="medium")
    steady.set_ylabel("samples/s")
    steady.set_ylim(bottom=0)
    first.set_title("first batch: two different windows", fontsize="medium")
    first.set_ylabel("ms (log)")
    first.set_yscale("log")
    for ax in (steady, first):
        ax.set_xlabel("num_workers")
        ax.set_xscale("symlog", base=2, linthresh=1)
        ticks = sorted(
            set(ours["num_workers"]) | (set(theirs["num_workers"]) if theirs is not None else set())
        )
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.2))
    return fig


def _ours(rows: pd.DataFrame, others: list[str]) -> tuple[pd.DataFrame, int | None]:
    """Our medians per worker count (and other knob of the matrix), in ms, with the speedups over
    the baseline worker count; and that count."""
    ours = median_by(
        rows,
        ["num_workers", *others],
        [
            "samples_per_s",
            "step_ms_median",
            "time_to_first_batch_s",
            "cuda_init_s",
            "first_batch_profiled_ms",
        ],
    )
    ours = ours.assign(
        num_workers=ours["num_workers"].astype(int),
        samples_per_s=ours["samples_per_s"].astype(float),
        steady_ms=ours["step_ms_median"].astype(float),
        first_batch_ms=1000 * ours["time_to_first_batch_s"].astype(float),
        cuda_init_ms=1000 * ours["cuda_init_s"].astype(float),
        profiled_ms=pd.to_numeric(ours["first_batch_profiled_ms"], errors="coerce"),
    )
    base = _baseline(ours["num_workers"])
    ours = ours.assign(
        first_over_steady=ours["first_batch_ms"] / ours["steady_ms"],
        steady_speedup=_relative(ours, "samples_per_s", others, base, True),
        first_batch_speedup=_relative(ours, "first_batch_ms", others, base, False),
        profiled_speedup=_relative(ours, "profiled_ms", others, base, False),
    )
    return ours, base


def _measured_table(ours: pd.DataFrame, others: list[str], here: str) -> Table:
    columns = [
        "num_workers",
        *others,
        "samples_per_s",
        "steady_ms",
        "first_batch_ms",
        "profiled_ms",
        "cuda_init_ms",
    ]
    return Table.of(
        ours[[*columns, "first_over_steady"]].rename(
            columns={
                "profiled_ms": "next() + .to() under the profiler [ms] (the notebook's window)",
                "samples_per_s": "samples/s (steady state)",
                "steady_ms": "ms per batch (steady state)",
                "first_batch_ms": "first batch [ms]",
                "cuda_init_ms": "CUDA init [ms], apart",
                "first_over_steady": "first batch / steady batch",
            }
        ),
        f"Measured on {here}: medians over the repeats",
    )


def _our_speedups(ours: pd.DataFrame, others: list[str], base: int | None) -> pd.DataFrame:
    """Our speedups over the baseline worker count: first batch, the notebook's window where
    profiled, steady state."""
    profiled = ours["profiled_ms"].notna().any()
    return ours[
        [
            "num_workers",
            *others,
            "first_batch_speedup",
            *(["profiled_speedup"] if profiled else []),
            "steady_speedup",
        ]
    ].rename(
        columns={
            "profiled_speedup": f"measured speedup of the notebook's window vs {base} (CUDA "
            "context made before it)",
            "first_batch_speedup": f"measured first-batch speedup vs {base} (worker start-up "
            "in, CUDA init out)",
            "steady_speedup": f"measured steady-state speedup vs {base}",
        }
    )


def _theirs(reference: pd.DataFrame) -> tuple[pd.DataFrame, str, int | None]:
    """The published table by worker count with its first-batch speedup and how each time was read;
    where it ran, and its baseline worker count."""
    where, their_base = (
        ", ".join(reference["hardware"].astype(str).unique()),
        _baseline(reference["num_workers"]),
    )
    theirs = reference.sort_values("num_workers", ignore_index=True)
    theirs["speedup"] = (
        theirs.loc[theirs["num_workers"] == their_base, "data_load_ms"].max()
        / theirs["data_load_ms"]
    )
    if "data_load_derived" not in theirs:
        theirs["data_load_derived"] = False
    theirs["how read"] = [
        "derived: CPU total / CPU total %" if str(d).lower() == "true" else "printed"
        for d in theirs["data_load_derived"]
    ]
    return theirs, where, their_base


def _published_table(
    theirs: pd.DataFrame, reference: pd.DataFrame, where: str, their_base: int | None
) -> Table:
    return Table.of(
        theirs[["num_workers", "data_load_ms", "how read", "h2d_memcpy_us", "speedup"]].rename(
            columns={
                "data_load_ms": "next() + .to() [ms]",
                "h2d_memcpy_us": "H2D copy [µs]",
                "speedup": f"speedup vs {their_base}",
            }
        ),
        f"Published ({', '.join(reference['source'].astype(str).unique())}) on {where}: profiler "
        "window of the first batch only (workers started before it; the CUDA context created "
        "inside it at 1 worker)",
    )


def _with_their_speedups(
    side: pd.DataFrame, theirs: pd.DataFrame, others: list[str], their_base
) -> pd.DataFrame:
    """Our speedups beside the published first-batch speedup, by worker count."""
    return (
        theirs[["num_workers", "speedup"]]
        .rename(
            columns={
                "speedup": f"published first-batch speedup vs {their_base} (CUDA init "
                "in, worker start-up out)"
            }
        )
        .merge(side, on="num_workers", how="outer")
        .sort_values(["num_workers", *others], ignore_index=True)
    )


def _verdict(ours: pd.DataFrame, base: int | None) -> str | None:
    """The worker count the steady state picks, beside the one the first batch alone would pick."""
    if not ours["samples_per_s"].notna().any():
        return None
    best = ours.loc[ours["samples_per_s"].idxmax()]
    verdict = (
        f"Steady state: {int(best['num_workers'])} workers load the most ("
        f"{best['samples_per_s']:.0f} samples/s, {best['steady_speedup']:.2f}× {base} worker(s))"
    )
    if ours["first_batch_ms"].notna().any():
        first = ours.loc[ours["first_batch_ms"].idxmin()]
        verdict += (
            f"; the first batch alone would pick {int(first['num_workers'])} workers "
            f"({first['first_batch_speedup']:.2f}×)"
        )
    if ours["cuda_init_ms"].notna().any():
        verdict += (
            f"; creating the CUDA context took {ours['cuda_init_ms'].median():.0f} "
            "ms, apart from both"
        )
    return verdict + "."


CPU_ONLY = (
    "Every cell ran on the CPU (no GPU in the results): there is no CUDA context to create, so "
    "the start-up the notebook counted at 1 worker (CUDA context creation in the first .to()) is "
    "absent here; the first batch is worker start-up alone."
)


def build(rows: pd.DataFrame, reference: pd.DataFrame | None, spec: dict) -> View:
    others = [k for k in spec.get("matrix") or {} if k != "num_workers" and k in rows]
    ours, base = _ours(rows, others)
    here = hardware(rows)
    view = View(
        "workers",
        TEXT,
        notes=common_notes(rows, reference, spec, "workers")
        + unfinished(rows, ["num_workers", *others]),
    )
    view.tables.append(_measured_table(ours, others, here))
    side = _our_speedups(ours, others, base)
    theirs, where = None, ""
    if reference is not None:
        theirs, where, their_base = _theirs(reference)
        view.tables.append(_published_table(theirs, reference, where, their_base))
        side = _with_their_speedups(side, theirs, others, their_base)
    view.tables.insert(
        0,
        Table.of(
            side,
            "Speedup over the baseline worker count: two different first-batch windows (not the "
            "same quantity) and our steady state",
        ),
    )
    if len(ours) or theirs is not None:
        view.figure = _figure(ours, others, theirs, here, where)
    view.verdict = _verdict(ours, base)
    if cpu_only(rows):
        view.notes.append(CPU_ONLY)
    return view
