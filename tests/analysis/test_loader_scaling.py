"""The loader on a target's cores (analysis.loader_scaling, docs/harness.md "The loader on another
machine"): the curve fitted to points measured here, its caps and the CPU speed factor; the workers'
steady-state CPU time the monitor records; and the done-when check of issue #25: from the cells with
the affinity mask at one core, the prediction for two cores is within BOUND (15 %, from its runs:
#32) of the cells measured with two.
"""

from __future__ import annotations

import os
import statistics

import pytest
from feedbench.analysis.loader_scaling import (
    LoaderPoint,
    fit_scaling,
    fit_text,
    loader_ceiling,
    loader_point,
    scaling_figure,
    scaling_rows,
)
from feedbench.analysis.plots import svg_text
from feedbench.core.records import record_of


def points(law, cores=(1, 2, 4, 8), noise=(1.0,)) -> list[LoaderPoint]:
    """One point per core count and noise factor, one worker per core, from samples/s =
    law(cores)."""
    return [
        LoaderPoint(n, n, law(n) * f, worker_cpu_ms=None, main_cpu_ms=None)
        for n in cores
        for f in noise
    ]


def test_one_core_count_can_only_say_linear():
    fit = fit_scaling(points(lambda n: 100 * n, cores=(1,), noise=(0.95, 1.05)))
    assert fit.model == "linear" and list(fit.residual) == ["linear"]
    assert fit.x1 == pytest.approx(100, rel=0.01)
    assert loader_ceiling(fit, cores=16) == pytest.approx(16 * fit.x1)


def test_one_core_count_with_cpu_time_stays_linear_and_a_burst_moves_it_little():
    """The CPU time caps the curve but sets no serial fraction; X1 is the median, so one repeat run
    under a burst of other load (200 of 400) moves it less than a mean would."""
    measured = [
        LoaderPoint(1, 1, rate, worker_cpu_ms=2.0, main_cpu_ms=0.5)
        for rate in (400.0, 410.0, 200.0)
    ]
    fit = fit_scaling(measured)
    assert fit.model == "linear" and fit.x1 == pytest.approx(400)
    assert loader_ceiling(fit, cores=2) == pytest.approx(800)


def test_the_curve_takes_the_most_workers_at_each_core_count():
    """A sample costs the workers more CPU the more of them there are: the one-worker cell at one
    core, faster per core than the two-worker one, is shown but not fitted, and does not lift the
    prediction for two workers on two cores; neither does a cell with fewer workers than cores."""
    measured = [
        LoaderPoint(1, 1, 880.0, worker_cpu_ms=1.1, main_cpu_ms=0.1),
        LoaderPoint(2, 1, 750.0, worker_cpu_ms=1.25, main_cpu_ms=0.1),
        LoaderPoint(2, 1, 760.0, worker_cpu_ms=1.25, main_cpu_ms=0.1),
        LoaderPoint(1, 2, 900.0, worker_cpu_ms=1.1, main_cpu_ms=0.1),
    ]
    fit = fit_scaling(measured)
    assert fit.x1 == pytest.approx(755, rel=1e-3) and len(fit.points) == 4  # log-median of 750, 760
    assert loader_ceiling(fit, cores=2, workers=2) == pytest.approx(1510, rel=1e-3)


def test_amdahl_is_chosen_and_its_serial_fraction_recovered():
    fit = fit_scaling(points(lambda n: 100 * n / (1 + 0.1 * (n - 1)), noise=(0.98, 1.02)))
    assert fit.model == "amdahl", fit_text(fit)
    assert fit.sigma == pytest.approx(0.1, abs=0.01) and fit.x1 == pytest.approx(100, rel=0.02)
    assert fit.residual["amdahl"] < fit.residual["linear"]


def test_usl_is_chosen_where_throughput_falls_past_a_peak():
    def law(n):  # peaks near 7 cores
        return 100 * n / (1 + 0.05 * (n - 1) + 0.02 * n * (n - 1))

    fit = fit_scaling(points(law, cores=(1, 2, 4, 8, 16), noise=(0.98, 1.02)))
    assert fit.model == "usl", fit_text(fit)
    assert fit.kappa == pytest.approx(0.02, abs=0.003)
    assert loader_ceiling(fit, 32) < loader_ceiling(fit, 8)


def test_linear_points_keep_the_model_with_one_parameter():
    """Amdahl and USL fit linear points as well, with s = k = 0, but pay a degree of freedom for
    it."""
    fit = fit_scaling(points(lambda n: 50 * n, noise=(0.97, 1.03)))
    assert fit.model == "linear", fit_text(fit)


def test_caps_workers_main_process_and_speed():
    measured = [
        # the curve: linear, 400 per core
        LoaderPoint(1, 1, 400.0, worker_cpu_ms=None, main_cpu_ms=None),
        # one worker on two cores: not on the curve
        LoaderPoint(1, 2, 500.0, worker_cpu_ms=2.0, main_cpu_ms=0.5),
        LoaderPoint(0, 1, 600.0, worker_cpu_ms=None, main_cpu_ms=1.6),
    ]
    fit = fit_scaling(measured)
    assert fit.serial_rate == 600 and fit.worker_cpu_ms == 2.0 and fit.main_cpu_ms == 0.5
    assert loader_ceiling(fit, cores=2) == pytest.approx(800)  # the curve: 2 x 400
    assert loader_ceiling(fit, cores=4, workers=1) == pytest.approx(500)  # one worker: 1000 / 2 ms
    assert loader_ceiling(fit, cores=16) == pytest.approx(2000)  # the main process: 1000 / 0.5 ms
    assert loader_ceiling(fit, cores=2, speed=1.5) == pytest.approx(1200)
    # no workers: cores do not help
    assert loader_ceiling(fit, cores=8, workers=0, speed=2.0) == pytest.approx(1200)


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match="num_workers >= cores"):
        fit_scaling([LoaderPoint(1, 2, 100.0, None, None)])
    fit = fit_scaling(points(lambda n: 100 * n, cores=(1,)))
    with pytest.raises(ValueError, match="allowed: cores >= 1 and a speed factor > 0"):
        loader_ceiling(fit, cores=0)


def test_table_and_figure_show_points_fit_residuals_and_prediction():
    fit = fit_scaling(
        [
            *points(lambda n: 100 * n, cores=(1, 2), noise=(0.95, 1.05)),
            LoaderPoint(2, 1, 90.0, 2.0, 0.3),
        ]
    )
    rows = scaling_rows(fit, target_cores=12, speed=1.2)
    measured = [row for row in rows if row["kind"] == "measured"]
    # the curve at one core is its cell with the most workers (90); the median of 90, 190 / 2 and
    # 210 / 2
    assert len(measured) == 5 and fit.x1 == pytest.approx(95)
    assert [round(row["residual_pct"]) for row in measured if row["cores"] == 1] == [0, 11, -5]
    assert [row["cores"] for row in rows if row["kind"] == "prediction"] == [1, 2, 4, 8, 12]
    assert rows[-1]["fitted_samples_per_s"] == pytest.approx(loader_ceiling(fit, 12, 12, 1.2))
    figure = scaling_figure(fit, target_cores=12, speed=1.2)
    # fit, scaled fit, the prediction's mark, two sets of measured points
    assert len(figure.axes[0].lines) == 5
    assert "prediction at 12 cores" in svg_text(figure, "loader")


def spin_loader(tmp_path, **knobs) -> dict:
    from feedbench.core.result import read_result
    from feedbench.harness.runner import run

    raw = dict(
        scenario="loader", dataset="synthetic", image_size=64, batch_size=8, num_workers=2, steps=40
    )
    raw.update(warmup_steps=2, torch_threads=1, device="cpu", monitor_interval_s=0.05, **knobs)
    assert run(raw, str(tmp_path)) == 0
    return read_result(str(tmp_path / "result.json"))


def test_the_monitor_keeps_each_workers_steady_state_apart_from_its_start(tmp_path):
    """window_cpu_s / window_wall_s: a worker's CPU between its first and last sample, never more
    than since it started; the point reads the workers' CPU ms per sample from it."""
    result = spin_loader(tmp_path, sample_delay_ms=2.0)
    workers = result["monitor"]["workers"]
    assert len(workers) == 2
    for worker in workers:
        assert (
            0 < worker["window_wall_s"] <= worker["wall_s"]
            and 0 <= worker["window_cpu_s"] <= worker["cpu_s"]
        )
        assert "first" not in worker
    # the cores its mask offered, less other load and the monitor's own
    offered = result["monitor"]["cpu_offered"]
    assert offered["cores"] == len(os.sched_getaffinity(0)) and offered["cell_cpu_s"] > 0
    assert (
        0 < offered["monitor_cpu_s"] < offered["cell_cpu_s"]
        and 0 <= offered["offered_cores"] <= offered["cores"]
    )
    point = loader_point(record_of(result, "result.json"))
    assert point.workers == 2 and point.cores >= 1 and point.samples_per_s > 0
    # a worker sleeps 2 ms of each sample: its CPU per sample is far below its wall time per sample
    # (2 x 1000 / X)
    assert 0 < point.worker_cpu_ms < 2 * 1000 / point.samples_per_s
    assert loader_point(record_of({**result, "status": "failed"}, "result.json")) is None


def test_a_point_counts_the_cores_its_cell_was_offered():
    """Other load took half of the cell's one core: the point is the rate on a free core (twice what
    it measured), and its CPU per sample is what the samples cost (the measured rate's); offered
    cores missing, under a tenth of the cell's, or of a cell with fewer workers than cores, leave
    the rate as measured."""
    result = {
        "status": "ok",
        "cell": {"scenario": "loader", "num_workers": 1},
        "metrics": {"samples_per_s": 200.0},
        "provenance": {"cores": {"usable": 1}},
        "monitor": {
            "stats": {"trainer_cpu_pct": {"mean": 10.0}},
            "workers": [{"window_cpu_s": 2.0, "window_wall_s": 5.0}],
            "cpu_offered": {"offered_cores": 0.5},
        },
    }
    point = loader_point(record_of(result, "result.json"))
    assert point.samples_per_s == pytest.approx(400) and point.offered_cores == 0.5
    # 0.4 x 1000 / 200
    assert point.worker_cpu_ms == pytest.approx(2.0) and point.main_cpu_ms == pytest.approx(0.5)
    for offered in (None, 0.05):
        result["monitor"]["cpu_offered"] = {"offered_cores": offered}
        point = loader_point(record_of(result, "result.json"))
        assert point.samples_per_s == 200 and point.offered_cores is None
    # one worker on two cores, other load on one of them: that core may be one the cell would not
    # have used
    result["monitor"]["cpu_offered"], result["provenance"]["cores"]["usable"] = (
        {"offered_cores": 1.0},
        2,
    )
    point = loader_point(record_of(result, "result.json"))
    assert point.samples_per_s == 200 and point.offered_cores is None


# The check's bound, from its runs (docs/results/prediction-error-loader.md, "Why one core cannot
# say two within 10 %"): 15 runs in fresh processes here, 5 with a CPU hog on one core, read -11.8
# to +1.9 % for examples/own-pipeline and -4.8 to +8.8 % for the JPEG folder (CI once -12.2 %),
# standard deviation 4 %: 15 % is 3 of them past the mean of either. The curve misses the two cores'
# idle share in the in-order hand-over (steadily 7 % for the shapes pipeline, 3 % for the JPEG
# folder), and a one-core cell's cost per sample varies by up to a fifth from run to run.
BOUND = 0.15


@pytest.mark.timing
@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two cores in this process's affinity mask (Linux)",
)
@pytest.mark.parametrize("pipeline", ["images", "shapes"])
def test_one_core_predicts_two_within_15_percent(tmp_path_factory, pipeline):
    """Issue #25's done-when, with the bound its runs justify: the loader alone (torch_threads 1)
    with two workers and the affinity mask at one core is the curve's point; the model (linear: one
    core count says nothing more) predicts two workers on two cores, and the cells measured with two
    cores (the median of 3, interleaved with the one-core runs) lie within BOUND. One worker on one
    core is not measured: the curve would not take it (a sample costs more with more workers).

    Every cell's rate is on free cores (loader_point: its samples/s over the cores its mask offered
    it, the mask's cores less what other processes and the monitor took, times its cores): a CPU hog
    on one core, or another session's tests, takes a share of the cells' cores and their samples/s
    with it, but not what a sample costs. The one-core cells run on the core other work left
    quietest (masked.quietest). What the curve cannot see from one core (the module's docstring): on
    two cores the cells' processes keep only 92 to 98 % of them busy (busy_share: the DataLoader's
    in-order hand-over makes a worker that is ahead wait), and one core time-sliced between two
    workers and the main process costs a sample 0 to 20 % more CPU than two cores do. The message
    gives both.
    """
    from helpers.loader_scaling import CHECK_CELLS, CHECK_REPEATS, measure

    runs = measure(
        str(tmp_path_factory.mktemp(f"loader-{pipeline}")), pipeline, CHECK_REPEATS, CHECK_CELLS
    )
    fit = fit_scaling([loader_point(result) for workers, cores, result in runs if cores == 1])
    predicted = loader_ceiling(fit, cores=2, workers=2)
    two = [loader_point(result) for workers, cores, result in runs if cores == 2]
    measured = statistics.median(p.samples_per_s for p in two)
    error = measured / predicted - 1
    offered = ", ".join(
        f"{p.offered_cores:.2f}" if p.offered_cores else "?" for p in fit.points + two
    )
    busy = ", ".join(f"{p.busy_share:.3f}" if p.busy_share else "?" for p in two)
    cost = [
        statistics.median(p.worker_cpu_ms + p.main_cpu_ms for p in points)
        for points in (fit.points, two)
    ]
    assert abs(error) <= BOUND, (
        f"{fit_text(fit)}: predicted {predicted:.0f}, measured {measured:.0f} ({error:+.1%}); "
        f"cores offered {offered}; two cores busy {busy}; CPU ms per sample, one core "
        f"{cost[0]:.2f}, two {cost[1]:.2f}"
    )
