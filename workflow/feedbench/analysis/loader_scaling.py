"""The loader on a machine it has not run on: per-sample CPU time and the worker-scaling curve
measured here, a model fitted beyond them, scaled to a target's cores and CPU speed (issue #25, "the
loader side for the target").

From each loader cell (scenario loader) measured here, a point (`loader_point`):

    W, N            its loader workers and the cores its process could use (provenance.cores.usable:
                    core.cores)
    X               the samples/s it delivered
    c_w, c_m        CPU ms per sample of its loader workers (monitor.workers: their CPU share in the
                    window times their number) and of its main process (the monitor's
                    trainer_cpu_pct over the window), over X

The curve is throughput against cores, from the points with a worker for every core (W >= N) and, at
each core count, the most workers measured there (`curve_points`): at one core the loader's
processes share it, at N cores they have N. Other points are shown against the model, not fitted:
with fewer workers than cores they are capped by their workers (below). Three models, each fitted in
log(X):

    linear   X(N) = X1 N                                   (1 parameter: all one core count can say)
    amdahl   X(N) = X1 N / (1 + s (N - 1))                 (2: s, the serial fraction)
    usl      X(N) = X1 N / (1 + s (N - 1) + k N (N - 1))   (3: Gunther's universal scalability law; k, crosstalk)

A model needs more points than parameters (Amdahl two core counts, USL three); the one with the
smallest residual per degree of freedom (sqrt(RSS / (n - parameters)), in log units) is chosen, so a
parameter is added only when it pays for itself. X1 is, for each candidate shape, the median of
log(X) less the shape's log speedup: one point measured under a burst of other load moves it less
than a mean would. From one core count (every cell on one machine, without masks) the curve is
linear: nothing measured says more, and the caps below still hold it.

What the curve assumes: its cores kept busy, and a sample's CPU cost the same at every core count.
From one core count it cannot see what only more cores show: with a core per worker, the
DataLoader's in-order hand-over leaves a share of them idle (a worker ahead of the one whose batch
comes next runs out of work and waits; on one core the other worker takes the core). On this 2-core
machine the cells' own processes kept 92 to 94 % of two cores busy for examples/own-pipeline and 96
to 98 % for the JPEG folder, steadily, and 100 % of one (`busy_share`); so from one core the curve
over-predicts two by that idle share, and a one-core cell's cost per sample varies a few % from run
to run on top (docs/results/prediction-error-loader.md). Measured at several core counts, Amdahl's s
takes the idle in.

The loader ceiling on `cores` with `workers` (`loader_ceiling`) is the curve at those cores, and
never more than the workers can load (W x 1000 / c_w: one core each at most) nor than the main
process can take in (1000 / c_m), all times the CPU speed factor of the target over this machine.
Without workers the main process loads alone: the one-process rate measured here (W = 0), times the
speed factor, whatever the cores.
"""  # noqa: E501

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..core.metrics import median_of_known
from ..core.records import Record
from .predict import positive

# Each model's parameter grid: s (serial fraction) in [0, 1], k (crosstalk) in [0, 0.2]. A grid
# rather than an optimiser: numpy only, no local minimum, and the fit is the same on every machine.
SIGMAS = np.linspace(0.0, 1.0, 401)
KAPPAS = np.linspace(0.0, 0.2, 201)
MODELS = {"linear": 1, "amdahl": 2, "usl": 3}  # parameters of each


@dataclass(frozen=True)
class LoaderPoint:
    """One loader cell measured here."""

    workers: int
    cores: int
    samples_per_s: float
    # all its workers' CPU ms per sample; None without workers or monitor samples
    worker_cpu_ms: float | None
    # its main process's CPU ms per sample over the window; None without monitor samples
    main_cpu_ms: float | None
    # the cores offered it over the window (monitor.cpu_offered); None: not read
    offered_cores: float | None = None
    # the share of those cores its own processes kept busy (the monitor's left out)
    busy_share: float | None = None


def _worker_cpu_ms(record: Record) -> float | None:
    """The workers' CPU ms per sample: their CPU share times the number of workers, over the samples
    per second.

    The share is each worker's CPU time over its wall time between its first and last sample in the
    window (monitor.workers window_cpu_s / window_wall_s: its steady state), pooled over the
    workers; in results before issue #25, over its whole life (cpu_s / wall_s), which its start-up
    and the warm-up make read low."""
    workers, count = (
        record.monitor.get("workers") or [],
        int((record.cell or {}).get("num_workers") or 0),
    )
    rate = positive(record.metrics.get("samples_per_s"))
    if not workers or not count or rate is None:
        return None
    window = sum(w.get("window_wall_s") or 0 for w in workers)
    cpu, wall = ("window_cpu_s", "window_wall_s") if window > 0 else ("cpu_s", "wall_s")
    cpu_s, wall_s = sum(w.get(cpu) or 0 for w in workers), sum(w.get(wall) or 0 for w in workers)
    return 1000 * (cpu_s / wall_s) * count / rate if cpu_s > 0 and wall_s > 0 else None


def loader_point(record: Record) -> LoaderPoint | None:
    """The point of one loader cell's record (core.records); None for a cell that is not a completed
    loader cell."""
    cell = record.cell or {}
    rate = positive(record.metrics.get("samples_per_s"))
    cores = (record.provenance.get("cores") or {}).get("usable")
    if record.status != "ok" or cell.get("scenario") != "loader" or rate is None or not cores:
        return None
    main_pct = ((record.monitor.get("stats") or {}).get("trainer_cpu_pct") or {}).get("mean")
    main = positive(main_pct)
    workers = int(cell.get("num_workers") or 0)
    offered = _offered_cores(record) if max(workers, 1) >= cores else None
    return LoaderPoint(
        workers=workers,
        cores=int(cores),
        samples_per_s=rate * cores / offered if offered else rate,  # on free cores
        # CPU per sample: other load slows the cell, not its samples' cost
        worker_cpu_ms=_worker_cpu_ms(record),
        # pct / 100 cores x 1000 ms / (samples/s)
        main_cpu_ms=10 * main / rate if main is not None else None,
        offered_cores=offered,
        busy_share=_busy_share(record) if offered else None,
    )


def _busy_share(record: Record) -> float | None:
    """The share of its offered cores the cell's own processes kept busy over the window: their CPU
    time (the main process and its workers, less the monitor's thread) over the offered cores times
    the window. Below 1 where the cell left a core idle: the in-order hand-over's wait with a core
    per worker, which the curve cannot see from one core count (the module's docstring)."""
    offered = record.monitor.get("cpu_offered") or {}
    cpu = (offered.get("cell_cpu_s") or 0) - (offered.get("monitor_cpu_s") or 0)
    capacity = (offered.get("offered_cores") or 0) * (offered.get("wall_s") or 0)
    return round(min(cpu / capacity, 1.0), 3) if cpu > 0 and capacity > 0 else None


def _offered_cores(record: Record) -> float | None:
    """The cores the cell's mask offered it over the window (monitor.cpu_offered), where they are
    known, are the cores the point counts, and at least a tenth of them were offered: below, other
    load swamped the cell. loader_point reads them only where the cell's busy processes could fill
    its cores (a worker for every core, or the main process alone on one): with fewer, the cores
    other load took may be cores the cell would not have used."""
    offered = (record.monitor.get("cpu_offered") or {}).get("offered_cores")
    cores = (record.provenance.get("cores") or {}).get("usable")
    if offered is None or not cores or offered < 0.1 * cores:
        return None
    return min(float(offered), float(cores))


def _speedup(model: str, sigma, kappa, cores) -> np.ndarray:
    """The model's speedup at `cores` (broadcast over arrays of s and k)."""
    cores = np.asarray(cores, dtype=float)
    if model == "linear":
        return cores
    return cores / (
        1 + sigma * (cores - 1) + (kappa * cores * (cores - 1) if model == "usl" else 0)
    )


def _fit_model(
    model: str, cores: np.ndarray, log_rates: np.ndarray
) -> tuple[float, float, float, float]:
    """(X1, s, k, RSS in log units) of the fit of `model` over its grid: for each grid point X1 is
    the median offset of log(X) from the shape, and the grid point of the least RSS wins (the
    smallest s and k among equals)."""
    sigma = SIGMAS[:, None, None] if model != "linear" else np.zeros((1, 1, 1))
    kappa = KAPPAS[None, :, None] if model == "usl" else np.zeros((1, 1, 1))
    shape = np.log(_speedup(model, sigma, kappa, cores[None, None, :]))
    log_x1 = np.median(log_rates - shape, axis=-1, keepdims=True)
    rss = np.sum((log_rates - log_x1 - shape) ** 2, axis=-1)
    i, j = np.unravel_index(int(np.argmin(rss)), rss.shape)
    return (
        math.exp(float(log_x1[i, j, 0])),
        float(sigma.flat[i]),
        float(kappa.flat[j]),
        float(rss[i, j]),
    )


@dataclass
class ScalingFit:
    """The curve fitted to the points, the CPU time per sample, and every point with its fitted
    value."""

    model: str
    x1: float  # samples/s on one core
    sigma: float
    kappa: float
    worker_cpu_ms: float | None  # median over the cells with workers
    main_cpu_ms: float | None
    serial_rate: float | None  # samples/s without workers (the main process alone), median
    points: list[LoaderPoint]
    # each candidate model's sqrt(RSS / (n - parameters))
    residual: dict[str, float] = field(default_factory=dict)

    def speedup(self, cores: float) -> float:
        return float(_speedup(self.model, self.sigma, self.kappa, cores))


def curve_points(points: list[LoaderPoint]) -> list[LoaderPoint]:
    """The points the curve is fitted to: at each core count, the cells with a worker for every core
    and the most workers there. A sample costs the workers more CPU the more of them there are,
    whatever the cores: the shapes pipeline's 1.11 ms with one worker on one core, 1.27 with two on
    one and 1.24 with two on two (the JPEG folder's 1.96, 2.09 and 2.01;
    docs/results/prediction-error-loader.md), so one core's median over one and two workers
    over-predicted two workers on two cores by 7 %. The most workers are also the nearest to a
    target's one worker per core."""
    most = {}
    for p in points:
        if p.workers >= p.cores >= 1:
            most[p.cores] = max(most.get(p.cores, 0), p.workers)
    return [p for p in points if p.cores in most and p.workers == most[p.cores]]


def fit_scaling(points: list[LoaderPoint]) -> ScalingFit:
    """The curve of throughput against cores from `curve_points`, the model chosen by its residual
    per degree of freedom (from one core count: linear); ValueError without a point with a worker
    for every core."""
    curve = curve_points(points)
    if not curve:
        have = (
            ", ".join(f"{p.workers} workers on {p.cores} cores" for p in points) or "no loader cell"
        )
        raise ValueError(
            f"no loader cell with a worker for every core ({have}): the curve "
            "needs num_workers >= cores"
        )
    cores = np.array([p.cores for p in curve], dtype=float)
    log_rates = np.log([p.samples_per_s for p in curve])
    fits, residual = {}, {}
    for model, parameters in MODELS.items():
        if len(curve) > parameters and len(set(cores)) >= parameters or model == "linear":
            fits[model] = _fit_model(model, cores, log_rates)
            residual[model] = math.sqrt(fits[model][3] / max(len(curve) - parameters, 1))
    model = min(residual, key=residual.get)
    x1, sigma, kappa, _ = fits[model]
    with_workers = [p for p in points if p.workers >= 1]
    return ScalingFit(
        model=model,
        x1=x1,
        sigma=sigma,
        kappa=kappa,
        worker_cpu_ms=median_of_known(p.worker_cpu_ms for p in with_workers),
        main_cpu_ms=median_of_known(p.main_cpu_ms for p in with_workers),
        serial_rate=median_of_known(p.samples_per_s for p in points if p.workers == 0),
        points=list(points),
        residual=residual,
    )


def loader_ceiling(
    fit: ScalingFit, cores: int, workers: int | None = None, speed: float = 1.0
) -> float | None:
    """The loader's samples/s on `cores` cores with `workers` workers (default: one per core) on a
    CPU `speed` times this machine's: the curve at `cores`, capped by what the workers and the main
    process can do; None for workers 0 when no cell without workers was measured."""
    if cores < 1 or speed <= 0:
        raise ValueError(
            f"cores {cores}, speed {speed}: allowed: cores >= 1 and a speed factor > 0"
        )
    workers = cores if workers is None else workers
    if workers == 0:
        return speed * fit.serial_rate if fit.serial_rate is not None else None
    rate = fit.x1 * fit.speedup(cores)
    if fit.worker_cpu_ms:
        rate = min(rate, workers * 1000 / fit.worker_cpu_ms)
    else:  # without the workers' CPU time: only as many cores as workers
        rate = fit.x1 * fit.speedup(min(cores, workers))
    if fit.main_cpu_ms:
        rate = min(rate, 1000 / fit.main_cpu_ms)
    return speed * rate


def fit_text(fit: ScalingFit) -> str:
    """The fit in one line: the model, its parameters, and each candidate's residual (log units, ~
    relative)."""
    params = {
        "linear": "",
        "amdahl": f", s {fit.sigma:.3f}",
        "usl": f", s {fit.sigma:.3f}, k {fit.kappa:.4f}",
    }
    residual = ", ".join(f"{model} {value:.3f}" for model, value in fit.residual.items())
    cpu = []
    if fit.worker_cpu_ms is not None:
        cpu.append(f"workers {fit.worker_cpu_ms:.2f} CPU ms per sample")
    if fit.main_cpu_ms is not None:
        cpu.append(f"main process {fit.main_cpu_ms:.2f}")
    return (
        f"{fit.model}: X1 {fit.x1:.1f} samples/s on one core{params[fit.model]}; "
        f"residual per degree of freedom {residual}" + (f"; {', '.join(cpu)}" if cpu else "")
    )


def scaling_rows(
    fit: ScalingFit, target_cores: int | None = None, speed: float = 1.0
) -> list[dict]:
    """The report's table: every measured point with the model's value there and its residual (100 x
    (measured / fitted - 1)), then the model at 1, 2, 4, ... cores up to `target_cores`, scaled by
    `speed`: predictions."""
    rows = []
    for p in sorted(fit.points, key=lambda p: (p.cores, p.workers)):
        fitted = loader_ceiling(fit, p.cores, p.workers)
        rows.append(
            {
                "kind": "measured",
                "cores": p.cores,
                "workers": p.workers,
                "samples_per_s": p.samples_per_s,
                "fitted_samples_per_s": fitted,
                "residual_pct": 100 * (p.samples_per_s / fitted - 1) if fitted else None,
                "worker_cpu_ms": p.worker_cpu_ms,
                "main_cpu_ms": p.main_cpu_ms,
                "busy_share": p.busy_share,
            }
        )
    if target_cores:
        cores = sorted({2**i for i in range(int(math.log2(target_cores)) + 1)} | {target_cores})
        for n in cores:
            rows.append(
                {
                    "kind": "prediction",
                    "cores": n,
                    "workers": n,
                    "fitted_samples_per_s": loader_ceiling(fit, n, n, speed),
                }
            )
    return rows


def scaling_figure(
    fit: ScalingFit, target_cores: int | None = None, speed: float = 1.0, title: str = ""
):
    """Measured samples/s against cores (dots), the fitted curve here (line) and, scaled by `speed`,
    the prediction up to `target_cores` (dashed, its end marked): a matplotlib Figure
    (plots.save_svg writes it)."""
    from matplotlib.figure import Figure

    top = max([target_cores or 1, *(p.cores for p in fit.points)])
    cores = np.arange(1, top + 1)
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(
        cores,
        [loader_ceiling(fit, n) for n in cores],
        color="#1f77b4",
        label=f"{fit.model} fit, here",
    )
    if target_cores and speed != 1.0:
        ax.plot(
            cores,
            [loader_ceiling(fit, n, n, speed) for n in cores],
            "--",
            color="#ff7f0e",
            label=f"x{speed:g} CPU",
        )
    if target_cores:
        ax.plot(
            [target_cores],
            [loader_ceiling(fit, target_cores, target_cores, speed)],
            "D",
            color="#ff7f0e",
            label=f"prediction at {target_cores} cores",
        )
    for workers in sorted({p.workers for p in fit.points}):
        mine = [p for p in fit.points if p.workers == workers]
        ax.plot(
            [p.cores for p in mine],
            [p.samples_per_s for p in mine],
            "o",
            alpha=0.7,
            label=f"measured, {workers} workers",
        )
    ax.set_xlabel("cores")
    ax.set_ylabel("loader samples/s")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title(title or fit_text(fit).split(";")[0], fontsize=10)
    return fig
