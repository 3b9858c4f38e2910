"""What each loader worker holds, and the main process: USS and PSS against the samples delivered
(the monitor's).

Each worker's own series is kept by worker id: the processes are ordered by their start, and a new
one takes the lowest id no live worker holds. A loader without persistent_workers starts its workers
again at each epoch boundary: the new processes take the ids the old ones left, and each process is
one run of its id's series (with its pid), so the growth fit (core.memory.fit) gives each run its
own intercept and a restart's drop is not read as shrinking. A worker's start-up is kept in its
series but not fitted (_settled): a fresh process copies the pages it starts with (a few MB forked,
hundreds spawned) before its first batch, a step that is not growth.

USS (memory only this process holds) is what a worker made its own: copies of pages it shared with
the main process at fork, and what it allocated. PSS adds its share of the pages it still shares.
Both read /proc/<pid>/smaps (psutil's memory_full_info): Linux only for PSS; elsewhere the series
hold RSS in its place.
"""

from __future__ import annotations

import time

import psutil

from ..core import memory

MB = 2**20
# The most points a stored series keeps (evenly thinned, its last point kept); the fit uses every
# point.
MAX_POINTS = 1000
SETTLE_S = 0.25


def _sizes(process: psutil.Process) -> tuple[float, float, float] | None:
    """(RSS, USS, PSS) in MB; PSS is RSS where the platform has none. None when the process is gone,
    hidden or exiting (its memory already released: a worker shutting down reads 0)."""
    try:
        info = process.memory_full_info()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    if not info.rss:
        return None
    return info.rss / MB, getattr(info, "uss", info.rss) / MB, getattr(info, "pss", info.rss) / MB


def _thin(values: list[float]) -> list[float]:
    if len(values) <= MAX_POINTS:
        return [round(v, 2) for v in values]
    step = len(values) / (MAX_POINTS - 1)
    picked = [values[int(i * step)] for i in range(MAX_POINTS - 1)] + [values[-1]]
    return [round(v, 2) for v in picked]


def _settled(run: dict) -> tuple[list[float], list[float]]:
    """The points of a run a fit may use: from the first one taken after its process settled
    (SETTLE_S) and after the loader delivered a sample more than at the run's first point, to the
    first one at its last count. A worker started anew (at an epoch boundary) starts while the
    loader waits for it, a spawned one importing torch for seconds: that start-up, and a worker that
    waits to be shut down, hold the count still and are not growth."""
    first = run.get("fit_from", 0)  # the main process: from its first point
    xs = run["samples"]
    if first is None or not xs:
        return [], []
    start = next((i for i, x in enumerate(xs) if x > xs[0]), len(xs))
    start = max(start, first)
    end = xs.index(xs[-1]) + 1  # counts only grow
    return xs[start:end], run["uss_mb"][start:end]


def _growth(runs: list[dict]) -> dict:
    """A series' fitted growth: MB per 1,000 samples, MB over a process's life in the window (the
    mean of its runs), and the fit's r2."""
    found = memory.fit([_settled(run) for run in runs])
    if found is None:
        return {"growth_mb_per_1k": None, "grown_mb": None, "r2": None, "_ss": 0.0}
    slope = found["mb_per_sample"]
    return {
        "growth_mb_per_1k": round(1000 * slope, 3),
        "grown_mb": round(slope * found["span"] / found["runs"], 2),
        "r2": round(found["r2"], 3),
        "_ss": found["ss"],
    }


def _stored(run: dict) -> dict:
    return {"pid": run["pid"], **{key: _thin(run[key]) for key in ("samples", "uss_mb", "pss_mb")}}


class MemorySeries:
    """The main process's and each worker's memory at each of the monitor's samples."""

    def __init__(self):
        self.main = {"pid": None, "samples": [], "rss_mb": [], "uss_mb": [], "pss_mb": []}
        self.ids: dict[tuple[int, float], int] = {}  # (pid, start) -> worker id
        self.runs: dict[tuple[int, float], dict] = {}  # (pid, start) -> that process's series
        # the main's PSS and the workers' summed, at the last sample
        self.used_mb: float | None = None

    def record(
        self, delivered: int, main: psutil.Process, workers: list[psutil.Process]
    ) -> dict[str, float]:
        """One sample of every process; the sums the monitor's stats keep (trainer_*_mb,
        workers_*_mb)."""
        sample = {}
        sizes = _sizes(main)
        if sizes is not None:
            self.main["pid"] = main.pid
            for key, value in zip(("rss_mb", "uss_mb", "pss_mb"), sizes, strict=True):
                self.main[key].append(value)
            self.main["samples"].append(delivered)
            sample.update(trainer_uss_mb=sizes[1], trainer_pss_mb=sizes[2])
        live, now = [], time.time()
        for child in workers:
            try:
                started = child.create_time()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            found = _sizes(child)
            if found is not None:
                live.append(((started, child.pid), found))
        live.sort()
        held = {
            self.ids[(pid, started)] for (started, pid), _ in live if (pid, started) in self.ids
        }
        pss = uss = 0.0
        for (started, pid), (_, worker_uss, worker_pss) in live:
            key = (pid, started)
            if key not in self.ids:
                self.ids[key] = min(set(range(len(held) + 1)) - held)
                held.add(self.ids[key])
            run = self.runs.setdefault(
                key, {"pid": pid, "samples": [], "uss_mb": [], "pss_mb": [], "fit_from": None}
            )
            if run["fit_from"] is None and now - started >= SETTLE_S:
                run["fit_from"] = len(run["samples"])
            run["samples"].append(delivered)
            run["uss_mb"].append(worker_uss)
            run["pss_mb"].append(worker_pss)
            pss, uss = pss + worker_pss, uss + worker_uss
        sample.update(workers_pss_mb=pss, workers_uss_mb=uss)
        if sizes is not None:
            self.used_mb = sizes[2] + pss
        return sample

    def summary(self, start_method: str | None) -> dict:
        """The series (thinned), each one's growth, the workers' summed, the cell's memory limit and
        the samples until the growth reaches it (core.memory)."""
        main = {**{key: _thin(v) if isinstance(v, list) else v for key, v in self.main.items()}}
        main.update(_growth([self.main]))
        by_id: dict[int, list[dict]] = {}
        for key, run in self.runs.items():
            by_id.setdefault(self.ids[key], []).append(run)
        workers = [
            {"worker": i, **_growth(runs), "runs": [_stored(run) for run in runs]}
            for i, runs in sorted(by_id.items())
        ]
        fitted = [w for w in workers if w["growth_mb_per_1k"] is not None]
        total_ss = sum(w["_ss"] for w in fitted)
        summed = {
            "growth_mb_per_1k": round(sum(w["growth_mb_per_1k"] for w in fitted), 3)
            if fitted
            else None,
            "grown_mb": round(sum(w["grown_mb"] for w in fitted), 2) if fitted else None,
            # the share of the workers' variance their fits explain together
            "r2": round(sum(w["r2"] * w["_ss"] for w in fitted) / total_ss, 3)
            if total_ss > 0
            else None,
        }
        rate = sum(
            part["growth_mb_per_1k"] / 1000
            for part in (summed, main)
            if memory.growing(part["grown_mb"], part["r2"])
        )
        limit = memory.memory_limit()
        for part in (main, *workers):
            part.pop("_ss")
        return {
            "start_method": start_method,
            "limit": limit,
            "used_mb": round(self.used_mb, 1) if self.used_mb is not None else None,
            "samples_to_limit": memory.samples_to_limit(
                limit["limit_mb"], self.used_mb or 0.0, rate
            ),
            "main": main,
            "workers": workers,
            "workers_growth_mb_per_1k": summed["growth_mb_per_1k"],
            "workers_grown_mb": summed["grown_mb"],
            "workers_r2": summed["r2"],
        }
