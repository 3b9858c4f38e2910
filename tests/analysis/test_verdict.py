"""Intervals over repeats, the baseline, the best cell, its speedup and what bounds it."""

from __future__ import annotations

import itertools
import math

import pandas as pd
import pytest
from feedbench.analysis.aggregate import load_results, read_summary
from feedbench.analysis.verdict import (
    DATA_STALL_PCT,
    TRANSFER_SHARE,
    baseline_cell,
    cell_table,
    classify,
    interval,
    summarize_experiment,
    t975,
)
from helpers.cells import run_cell_process, tiny_mlp
from helpers.real_results import EXPERIMENTS, real_matrix  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def summary(real_matrix):  # noqa: F811
    return load_results(real_matrix.paths)


def test_t_interval_of_known_values():
    # Crafted values: mean 12, sd 1, n 3 -> half width t(0.975, 2) / sqrt(3).
    stats = interval([11.0, 13.0, 12.0])
    assert (stats.n, stats.median, stats.mean) == (3, 12.0, 12.0)
    assert stats.high - stats.mean == pytest.approx(4.303 / math.sqrt(3), rel=1e-4)
    assert stats.mean - stats.low == pytest.approx(stats.high - stats.mean) and not stats.cut
    # mean 2: the half width reaches below zero, where no throughput goes; values that may be
    # negative keep theirs
    low = interval([1.0, 3.0, 2.0])
    assert low.low == 0.0 and low.cut and low.high == pytest.approx(stats.high - 10)
    assert interval([-1.0, 1.0, 0.0]).low == pytest.approx(-4.303 / math.sqrt(3), rel=1e-4)


def test_interval_ignores_missing_values_and_needs_two():
    assert interval([5.0, None, float("nan")]) == interval([5.0])
    one = interval([5.0])
    assert (one.n, one.median, one.low, one.high) == (1, 5.0, None, None)
    assert interval([]).n == 0


def test_t_quantiles_fall_towards_the_normal_one():
    values = [t975(df) for df in range(1, 200)]
    assert values[0] == 12.706 and values[-1] == 1.960
    assert all(a >= b for a, b in itertools.pairwise(values))
    with pytest.raises(ValueError):
        t975(0)


@pytest.mark.parametrize(
    "scenario, stall, h2d, prefetch, bound",
    [
        ("train", DATA_STALL_PCT, 0.5, "none", "data"),  # the stall wins over the copy
        ("train", DATA_STALL_PCT - 0.1, TRANSFER_SHARE, "none", "transfer"),
        ("train", 1.0, 0.5, "stream", "compute"),  # an overlapped copy bounds nothing by its share
        ("train", 1.0, TRANSFER_SHARE / 2, "none", "compute"),
        ("train", None, None, "none", "compute"),
        ("loader", 99.0, None, "none", "ceiling"),
        ("compute", 0.0, None, "none", "ceiling"),
        ("transfer", None, None, "none", "ceiling"),
    ],
)
def test_bound_rule(scenario, stall, h2d, prefetch, bound):
    # Crafted shares at and around the documented thresholds.
    found, why = classify(scenario, stall, h2d, prefetch)
    assert found == bound and why


@pytest.mark.timing  # the stall measured in real_matrix (built in the timing phase, alone)
def test_a_slow_sample_makes_a_real_training_cell_data_bound(summary):
    """0.5 ms per sample x 32 samples per batch dwarfs a 64-wide MLP step: the measured stall must
    say data.

    Margin on a busy 2-core machine: with no workers the trainer sleeps >= 16 ms per batch, and the
    MLP step on one thread (torch_threads: 1, pinned in real_results.FAST) takes well under 1 ms
    alone (stall 86-90 %). The stall stays >= 10 % unless the step grows past 9 x 16 ms = 144 ms,
    which a single thread sharing a core with one other busy process does not reach; two threads on
    a loaded machine did (issue #10: 9.07 %).
    """
    table = cell_table(summary[summary["experiment"] == "train"]).set_index("cell")
    for cell in ("hidden_layers-1_sample_delay_ms-0.5", "hidden_layers-4_sample_delay_ms-0.5"):
        assert table.loc[cell, "stall_pct"] >= DATA_STALL_PCT
        assert table.loc[cell, "bound"] == "data"
    assert set(cell_table(summary[summary["experiment"] == "loader"])["bound"]) == {"ceiling"}


def test_baseline_is_the_cell_labelled_so(summary):
    loader = summary[summary["experiment"] == "loader"]
    # On a CPU both num_workers-0 cells ran unpinned: the label, not the knobs as they ran, names
    # the baseline.
    assert baseline_cell(loader) == "num_workers-0_pin_memory-false"
    assert set(loader.loc[loader["baseline"], "cell"]) == {"num_workers-0_pin_memory-false"}
    train = summary[summary["experiment"] == "train"]
    assert baseline_cell(train) == "hidden_layers-1_sample_delay_ms-0.0"


def test_results_without_the_label_have_no_baseline_and_say_why(summary):
    """Results written before cells carried `baseline` aggregate, with the column empty: no speedup,
    and a note."""
    rows = summary[summary["experiment"] == "train"].assign(baseline=None)
    found = summarize_experiment(rows, EXPERIMENTS["train"]["matrix"])
    assert baseline_cell(rows) is None and found["baseline"] is None and found["speedup"] is None
    assert "written before" in found["note"] and found["best"] is not None
    assert baseline_cell(rows.drop(columns="baseline")) is None


def test_best_cell_and_speedup_agree_with_pandas(summary):
    rows = summary[summary["experiment"] == "train"]
    found = summarize_experiment(rows, EXPERIMENTS["train"]["matrix"])
    medians = rows[rows["status"] == "ok"].groupby("cell")["samples_per_s"].median()
    assert found["metric"] == "samples_per_s"
    assert found["best"]["cell"] == medians.idxmax()
    assert found["speedup"] == pytest.approx(
        medians.max() / medians["hidden_layers-1_sample_delay_ms-0.0"]
    )
    best, base = found["best"], found["baseline"]
    assert found["clear"] == (best["cell"] != base["cell"] and best["low"] > base["high"])
    assert found["knobs"] == ["hidden_layers", "sample_delay_ms"]  # matrix order


def test_transfer_experiment_is_judged_by_peak_bandwidth(summary):
    found = summarize_experiment(
        summary[summary["experiment"] == "transfer"], EXPERIMENTS["transfer"]["matrix"]
    )
    assert found["metric"] == "transfer_peak_gb_per_s"
    assert found["best"]["median"] > 0 and found["speedup"] == 1.0 and not found["clear"]


def test_failed_experiment_and_failed_baseline_say_so(summary):
    broken = summarize_experiment(
        summary[summary["experiment"] == "broken"], {"model": ["resnet18"]}
    )
    assert broken["best"] is None and "no cell" in broken["note"]
    assert broken["cells"].iloc[0]["bound"] == "failed"
    # Crafted: the baseline's repeats marked failed, as a crash would leave them.
    rows = summary[summary["experiment"] == "train"].copy()
    rows.loc[rows["cell"] == "hidden_layers-1_sample_delay_ms-0.0", "status"] = "failed"
    found = summarize_experiment(rows, EXPERIMENTS["train"]["matrix"])
    assert found["speedup"] is None and "did not finish" in found["note"]
    assert found["best"] is not None


def test_the_baseline_label_survives_the_csv(summary, tmp_path):
    path = tmp_path / "s.csv"
    summary.to_csv(path, index=False)
    again = read_summary(path)
    assert baseline_cell(again[again["experiment"] == "loader"]) == "num_workers-0_pin_memory-false"
    assert (
        baseline_cell(again[again["experiment"] == "train"])
        == "hidden_layers-1_sample_delay_ms-0.0"
    )


def test_scaling_efficiency_against_the_one_gpu_cell(tmp_path):
    """Real ddp cells on gloo "GPUs": 1 and 2 ranks; efficiency = speedup / (GPUs / 1)."""
    from feedbench.analysis.aggregate import load_results
    from feedbench.analysis.verdict import summarize_experiment

    paths = []
    for gpus in (1, 2):
        out = tmp_path / f"gpus-{gpus}" / "rep1"
        knobs = dict(
            parallel="ddp",
            gpus_per_node=gpus,
            experiment="scaling",
            cell=f"gpus_per_node-{gpus}",
            repeat=1,
        )
        run_cell_process(out, tiny_mlp(steps=5, baseline=gpus == 1, **knobs), check=True)
        paths.append(str(out / "result.json"))
    verdict = summarize_experiment(load_results(paths), {"gpus_per_node": [1, 2]})
    cells = verdict["cells"].set_index("cell")
    assert list(cells["gpus"]) == [1, 2]
    assert cells.loc["gpus_per_node-1", "efficiency"] == pytest.approx(1.0)
    two = cells.loc["gpus_per_node-2"]
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    assert two["speedup"] == pytest.approx(two["median"] / cells.loc["gpus_per_node-1", "median"])


def test_a_cell_that_took_its_twins_result_is_named_once_among_the_slower_cells():
    """On a machine without CUDA a pinned cell takes the result of its unpinned twin (plan.twins):
    the slower cells' epoch stalls name the measured one, not the same figures twice."""
    from feedbench.core.fit import TWIN_NOTE, twin_of

    def cell(name, workers, pinned, rate, baseline=False, stall_s=0.0, note=None):
        return {
            "experiment": "workers",
            "cell": name,
            "repeat": 1,
            "baseline": baseline,
            "status": "ok",
            "scenario": "loader",
            "num_workers": workers,
            "pin_memory": pinned,
            "samples_per_s": rate,
            "window_s": 1.0,
            "time_to_first_batch_s": 0.01,
            "epoch_boundaries": 2,
            "epoch_stall_ms": 1000 * stall_s / 2,
            "epoch_stall_s": stall_s,
            "adjustments": note,
        }

    note = f"pin_memory: no CUDA, not pinned; {TWIN_NOTE.format(twin='w1-unpinned')}"
    assert twin_of(note) == "w1-unpinned" and twin_of("pin_memory: no CUDA") is None
    rows = pd.DataFrame(
        [
            cell("w0", 0, False, 100.0, baseline=True),
            cell("w1-unpinned", 1, False, 80.0, stall_s=0.2),
            cell("w1-pinned", 1, True, 80.0, stall_s=0.2, note=note),
            cell("w2", 2, False, 120.0),
        ]
    )
    found = summarize_experiment(rows, {"num_workers": [0, 1, 2], "pin_memory": [False, True]})
    table = found["cells"].set_index("cell")
    assert table.loc["w1-pinned", "measured_as"] == "w1-unpinned"
    assert table["measured_as"].isna().sum() == 3
    # named by its label, in words (#49), once
    assert "num_workers=1 pin_memory=false (2 boundaries at 100 ms" in found["time_lost"]
    assert "pin_memory=true" not in found["time_lost"], found["time_lost"]
