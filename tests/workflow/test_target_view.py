"""The report's section "On <target>" (feedbench.analysis.target_view): its arithmetic on hand-made
inputs, and a real small run with a `target:` that writes results/target.json and shows the
section."""

from __future__ import annotations

import json

import pytest
from feedbench.analysis import target_view
from feedbench.analysis.loader_scaling import LoaderPoint, fit_scaling
from feedbench.core.ceilings import LOADER_REACHES
from feedbench.core.records import record_of
from helpers.browser import assert_fits, find_chromium, inspect
from helpers.snakemake_run import snakemake, workflow_copy

# The range's and the "measure there" line's drawn widths, in the section "On <target>", and the
# line's text.
SEEN_JS = """JSON.stringify((() => {
  const range = document.querySelector('#target .target-range');
  const measure = document.querySelector('#target .target-measure small');
  return {range: range ? range.getBoundingClientRect().width : 0,
          measure: measure ? measure.getBoundingClientRect().width : 0,
          measureText: measure ? measure.textContent.trim() : ''};
})())"""
TARGET = {
    "gpu": "H100",
    "cores_per_gpu": 8,
    "cpu_speed": 1.0,
    "link_gb_per_s": 10.0,
    "default_cpus_per_gpu": 2,
}


def fit(per_core: float = 100.0, worker_ms: float | None = None):
    """A loader that delivers `per_core` samples/s per core (linear: one core count), 10 without
    workers."""
    points = [LoaderPoint(2, 2, 2 * per_core, worker_ms, None), LoaderPoint(0, 2, 10.0, None, None)]
    return fit_scaling(points)


def cell(
    compute_s: float = 0.01,
    batch: int = 10,
    copy_s: float = 0.0,
    workers: int = 1,
    stream: bool = False,
):
    return {
        "batch_size": batch,
        "num_workers": workers,
        "stream_prefetch": stream,
        "batch_bytes": copy_s * TARGET["link_gb_per_s"] * 1e9,
        "copy_s": copy_s,
        "compute_s": compute_s,
    }


def test_the_prediction_is_the_slower_of_loader_and_trainer():
    # Compute 1,000 samples/s; the loader 100 per core: with one worker on 8 cores the curve gives
    # 800, the worker one core's worth at most when its CPU time is known (10 ms a sample: 100/s).
    rate, bound = target_view.predicted(cell(), fit(worker_ms=10.0), TARGET, 1, 8)
    assert rate == pytest.approx(100.0) and bound == "data"
    rate, bound = target_view.predicted(cell(compute_s=0.1), fit(worker_ms=10.0), TARGET, 4, 8)
    assert rate == pytest.approx(100.0) and bound == "compute"


def test_the_copy_adds_to_compute_unless_a_stream_prefetches():
    assert target_view.trainer_rate(cell(compute_s=0.01, copy_s=0.01)) == pytest.approx(500.0)
    assert target_view.trainer_rate(
        cell(compute_s=0.01, copy_s=0.01, stream=True)
    ) == pytest.approx(1000.0)


def test_fewest_workers_reach_95_percent_of_the_compute_ceiling():
    # 1,000 samples/s of compute, 100 per worker: 10 workers reach it, but 8 cores leave room for 7.
    workers, share, reached = target_view.fewest_workers(cell(), fit(worker_ms=10.0), TARGET)
    assert (workers, reached) == (7, False) and share == pytest.approx(0.7)
    # 300 per worker: 4 workers give 1,200 -> the ceiling; 3 give 900, 90 % < 95 %.
    workers, share, reached = target_view.fewest_workers(
        cell(), fit(per_core=300.0, worker_ms=1000 / 300), TARGET
    )
    assert workers == 4 and reached and share >= LOADER_REACHES


def test_with_the_default_cpus_the_trainer_waits_on_data():
    # 2 CPUs: the rank and one worker, 100 samples/s against 1,000 of compute: 90 % of the time
    # waits.
    found = target_view.starved(cell(), fit(worker_ms=10.0), TARGET, 2)
    assert found["workers"] == 1 and found["starved_pct"] == pytest.approx(90.0)
    # 1 CPU: no worker, the main process loads (10/s measured without workers) then trains, in
    # series.
    found = target_view.starved(cell(), fit(worker_ms=10.0), TARGET, 1)
    assert found["workers"] == 0 and found["predicted"] == pytest.approx(1 / (1 / 10 + 1 / 1000))
    assert target_view.starved(cell(), fit(), TARGET, None) is None


def test_memory_is_the_main_process_and_each_worker_measured():
    def result(workers, main, pooled):
        stats = {"trainer_pss_mb": {"max": main}, "workers_pss_mb": {"max": pooled}}
        return record_of(
            {"cell": {"num_workers": workers}, "monitor": {"stats": stats}}, "result.json"
        )

    # 500 MB main, 400 MB over 2 workers: 200 each; 5 workers -> 1,500 MB -> 2 GiB.
    assert target_view.memory_mb([result(2, 500.0, 400.0)], 5) == 2048
    assert target_view.memory_mb([result(2, 500.0, 400.0), result(2, 1100.0, 400.0)], 0) == 2048
    assert target_view.memory_mb([record_of({"cell": {}, "monitor": {}}, "result.json")], 3) is None


def test_a_loader_cell_serves_the_training_cells_with_its_loader_whatever_the_workers():
    training = {
        "scenario": "train",
        "model": "mlp",
        "dataset": "memory",
        "batch_size": 16,
        "num_workers": 1,
    }
    loader = {**training, "scenario": "loader", "num_workers": 4, "steps": 99}
    assert target_view.same_loader(loader, training)
    assert not target_view.same_loader({**loader, "batch_size": 32}, training)


MLP = {
    "model": "mlp",
    "dataset": "memory",
    "input_size": 64,
    "width": 64,
    "batch_size": 16,
    "num_samples": 64,
}


def test_a_run_with_a_target_writes_its_estimates_and_the_section(tmp_path):
    config = {
        "defaults": {
            "repeats": 1,
            "steps": 4,
            "warmup_steps": 1,
            "device": "cpu",
            "torch_threads": 1,
        },
        # compute: measured plans the training cell's compute ceiling on a GPU; with none here it
        # fails, and the section says so beside the estimate it uses instead.
        "target": {"gpu": "H100", "cores_per_gpu": 4, "cpu_speed": 1.0, "compute": "measured"},
        "experiments": {
            # Sampled often enough that 4 steps have memory to size mem_mb from (a knob no ceiling
            # keeps).
            "w": {
                "ceilings": True,
                "base": {**MLP, "scenario": "train", "num_workers": 1, "monitor_interval_s": 0.02},
            },
            "curve": {"base": {**MLP, "scenario": "loader"}, "matrix": {"num_workers": [2]}},
        },
    }
    workflow, work = workflow_copy(tmp_path)
    run = snakemake(workflow, work, config)
    # No GPU: the measured compute cell failed, so the run names it and exits 1, with the section
    # made all the same.
    assert run.returncode == 1, run.stderr[-4000:]
    [failed] = [line for line in run.stderr.splitlines() if line.startswith("target-compute / ")]
    assert "knob 'device': value 'cuda' is not available" in failed, failed
    estimates = json.loads((work / "results" / "target.json").read_text())
    (key,) = estimates["cells"]
    entry = estimates["cells"][key]
    assert (
        key.startswith("w/") and entry["family"] == "mlp" and entry["efficiency_from"] == "kernels"
    )
    assert entry["flops"] > 0 and entry["compute_s"] > 0 and entry["copy_s"] > 0
    assert entry["compute_from"] == "estimated" and entry["measured_cell"].startswith(
        "target-compute/"
    )
    assert entry["measured"].startswith("failed: knob 'device': value 'cuda' is not available"), (
        entry["measured"]
    )
    assert (
        0
        < estimates["published_error"]["median_error"]
        <= estimates["published_error"]["worst_error"]
    )
    html = (work / "results" / "report" / "index.html").read_text()
    section = html[html.index('<section id="target">') :]
    section = section[: section.index("</section>")]
    assert "On NVIDIA H100" in section and key.split("/")[1] in section
    assert "predicted" in section and "prediction-error.md" in section
    assert "workers: " in section and "cpus_per_task: " in section and "mem_mb: " in section
    assert "not known" in section  # no default_cpus_per_gpu in the target
    assert (
        "measured there: failed: knob &#39;device&#39;" in section
        and "the estimate is used" in section
    )
    assert "1.0x a core here (given in the config)" in section
    # A width-64 MLP's roofline is far below the host's time for its kernels: the estimate is the
    # host's time, host-bound, and says so.
    assert entry["compute_s"] == entry["host_s"] and entry["host_bound"]
    assert f"host-bound: {entry['kernels']} kernels" in section
    # #51 item 3: a host-bound cell's range is open above, and the section says measure there.
    assert entry["compute_range_s"][1] is None and entry["measure_there"]
    assert (
        "is at least half the estimate, so it is open above" in section
        and "Too wide to plan on (over 1.5x): measure there" in section
    )
    assert "compute: measured, partition: &lt;its GPU partition&gt;" in section
    # As a reader sees it: the range and "measure there" on a laptop and a phone, the page fitting
    # both.
    if find_chromium() is None:
        pytest.skip(
            "the Chromium half needs Chromium: run `make system-deps` as root (or "
            "`apt-get install chromium`)"
        )
    for width in (1280, 390):
        page = inspect(
            str(work / "results" / "report" / "index.html"), width=width, evaluate={"seen": SEEN_JS}
        )
        assert_fits(page, f"the section 'On H100' at {width} px", width)
        seen = page.found["seen"]
        assert seen["range"] > 0 and seen["measure"] > 0, (width, seen)  # drawn, not hidden
        assert seen["measureText"].startswith("compute range: host-bound"), seen


def test_a_cell_without_a_count_or_a_loader_curve_says_why():
    target = {**TARGET, "default_cpus_per_gpu": None}
    uncounted = {**cell(), "error": "model 'mine': no compute estimate", "knobs": {}}
    del uncounted["compute_s"]
    row = target_view.cell_row("w/own", uncounted, [], target, [])
    assert row["note"] == "no compute estimate: model 'mine': no compute estimate"
    # A loader cell with fewer workers than cores is no point of the curve.
    loaders = [({"scenario": "loader", "num_workers": 1}, LoaderPoint(1, 2, 100.0, None, None))]
    row = target_view.cell_row(
        "w/a", {**cell(), "knobs": {"scenario": "train", "num_workers": 1}}, loaders, target, []
    )
    assert row["note"].startswith(
        "no loader prediction: no loader cell with a worker for every core"
    )


def test_the_compute_range_gives_the_rate_and_the_cpus_at_both_ends():
    """#38 item 5: a compute range of 5 to 20 ms a step (a 4x span): 2,000 to 500 samples/s of
    compute, so the loader (100 samples/s a worker) needs 7 workers at the fast end (the most 8
    cores fit) and 5 at the slow end; the cell's own 7 workers predict 700 samples/s (data-bound) at
    the fast end, 500 (compute) at the slow one."""
    ranged = {
        **cell(compute_s=0.01, workers=7),
        "compute_range_s": [0.005, 0.02],
        "range_from": "x",
        "range_span": 4.0,
    }
    ranged["measure_there"] = True
    found = target_view.range_row(ranged, fit(worker_ms=10.0), TARGET)
    assert found["cpus_range"] == [8, 6] and found["measure_there"]
    assert found["predicted_range"][0] == pytest.approx(700.0) and found["predicted_range"][
        1
    ] == pytest.approx(500.0)
    # measured there: no range
    assert target_view.range_row(cell(), fit(worker_ms=10.0), TARGET) == {}
    open_ended = target_view.range_row(
        {**ranged, "compute_range_s": [0.01, None]}, fit(worker_ms=10.0), TARGET
    )
    assert open_ended["predicted_range"][1] is None and open_ended["cpus_range"][1] is None
