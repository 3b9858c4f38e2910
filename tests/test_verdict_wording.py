"""What the verdict says about a gain: no interval from one repeat, the interval from 2 or more, and when they
overlap a rough power estimate of the repeats that would separate the gain."""

from __future__ import annotations

import math

import pandas as pd
from feedbench.verdict import POWER_FACTOR, gain_wording, interval, repeats_to_separate, summarize_experiment


def rows(values_by_cell: dict[str, list[float]]) -> pd.DataFrame:
    """Summary rows of one experiment (crafted throughputs); the first cell is the labelled baseline."""
    out = []
    for i, (cell, values) in enumerate(values_by_cell.items()):
        for repeat, value in enumerate(values):
            out.append(
                {
                    "experiment": "e",
                    "cell": cell,
                    "repeat": repeat,
                    "status": "ok",
                    "scenario": "train",
                    "num_workers": i,
                    "samples_per_s": value,
                    "baseline": i == 0,
                }
            )
    return pd.DataFrame(out)


def test_one_repeat_has_no_interval_and_says_the_gain_cannot_be_judged():
    found = summarize_experiment(rows({"num_workers-0": [100.0], "num_workers-2": [150.0]}))
    assert found["speedup"] == 1.5 and not found["clear"]
    assert found["wording"].startswith(
        "cannot be judged from one run: with fewer than 2 repeats a cell has no interval"
    )
    assert "intervals overlap" not in found["wording"]
    assert "3 or more repeats" in found["wording"]


def test_one_repeat_on_one_side_is_enough_to_withhold_the_judgement():
    found = summarize_experiment(rows({"num_workers-0": [100.0], "num_workers-2": [150.0, 151.0, 149.0]}))
    assert found["wording"].startswith("cannot be judged from one run")


def test_separate_intervals_are_called_clear():
    found = summarize_experiment(rows({"num_workers-0": [100.0, 101.0, 99.0], "num_workers-2": [150.0, 151.0, 149.0]}))
    assert found["clear"] and found["wording"] == "clear: the 95 % intervals do not overlap"


def test_overlapping_intervals_come_with_a_rough_repeat_estimate():
    base, best = [100.0, 110.0, 90.0], [105.0, 115.0, 95.0]  # sd 10 each, gain 5
    found = summarize_experiment(rows({"num_workers-0": base, "num_workers-2": best}))
    # n = 2 (1.96 + 0.84)^2 sd^2 / gain^2 = 15.7 * 100 / 25 -> 63.
    assert repeats_to_separate(found["best"], found["baseline"]) == math.ceil(POWER_FACTOR * 100 / 25) == 63
    assert found["wording"] == (
        "within noise: the 95 % intervals overlap; about 63 repeats per cell would separate a "
        "gain this size at the measured spread (a rough power estimate: 80 % power, 5 % level)"
    )


def test_the_estimate_falls_with_the_spread_and_needs_a_gain():
    def cell(values, name):
        stats = interval(values)
        return {"cell": name, "n": stats.n, "mean": stats.mean, "low": stats.low, "high": stats.high}

    base = cell([100.0, 110.0, 90.0], "a")
    noisy, quiet = cell([105.0, 125.0, 85.0], "b"), cell([105.0, 106.0, 104.0], "c")
    assert repeats_to_separate(quiet, base) < repeats_to_separate(noisy, base)
    assert repeats_to_separate(base, quiet) is None  # no gain, nothing to separate
    assert gain_wording(base, base, clear=False) == "this is the baseline"
    assert gain_wording(base, quiet, clear=False) == "within noise: the 95 % intervals overlap"
