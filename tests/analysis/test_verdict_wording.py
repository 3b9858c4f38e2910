"""What the verdict says about a gain: no interval from one repeat, the interval from 2 or more, and
when they overlap a rough power estimate of the repeats that would separate the gain."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from feedbench.analysis.verdict import (
    gain_wording,
    interval,
    repeats_to_separate,
    summarize_experiment,
)
from helpers.summary_rows import verdict_row


def rows(values_by_cell: dict[str, list[float]]) -> pd.DataFrame:
    """Summary rows of one experiment (crafted throughputs); the first cell is the labelled
    baseline."""
    out = []
    for i, (cell, values) in enumerate(values_by_cell.items()):
        for repeat, value in enumerate(values):
            out.append(verdict_row(cell, repeat, i == 0, num_workers=i, samples_per_s=value))
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
    found = summarize_experiment(
        rows({"num_workers-0": [100.0], "num_workers-2": [150.0, 151.0, 149.0]})
    )
    assert found["wording"].startswith("cannot be judged from one run")


def test_separate_intervals_are_called_clear():
    found = summarize_experiment(
        rows({"num_workers-0": [100.0, 101.0, 99.0], "num_workers-2": [150.0, 151.0, 149.0]})
    )
    assert found["clear"] and found["wording"] == "clear: the 95 % intervals do not overlap"


def repeats(mean: float, sd: float, n: int) -> list[float]:
    """n values whose mean and sample standard deviation are exactly `mean` and `sd`."""
    steps = [i - (n - 1) / 2 for i in range(n)]
    scale = sd / math.sqrt(sum(k * k for k in steps) / (n - 1))
    return [mean + scale * k for k in steps]


def test_overlapping_intervals_come_with_a_rough_repeat_estimate():
    base, best = [100.0, 110.0, 90.0], [105.0, 115.0, 95.0]  # sd 10 each, gain 5
    found = summarize_experiment(rows({"num_workers-0": base, "num_workers-2": best}))
    # The first n with sqrt(n) 5 >= t(0.975, n-1) (10 + 10) + 0.8416 sqrt(200): t(0.975, 107) is
    # read from the table's df 60 row, 2.000, so the right side is 51.90; sqrt(107) 5 = 51.72 falls
    # short, sqrt(108) 5 = 51.96 does not.
    needed = repeats_to_separate(found["best"], found["baseline"])
    assert needed == 108
    assert found["wording"] == (
        f"within noise: the 95 % intervals overlap; about {needed} repeats per cell would "
        "separate a gain this size at the measured spread (a rough power estimate: the "
        "intervals apart with 80 % power)"
    )


@pytest.mark.parametrize("run", [2, 3])
def test_the_estimate_names_more_repeats_than_already_overlap(run):
    # A gain of 3 sd overlaps at 2 and 3 repeats (t 12.7 and 4.3), yet the z-approximation once said
    # "about 2": 2 (1.96 + 0.84)^2 sd^2 / gain^2 = 1.7.
    found = summarize_experiment(
        rows(
            {"num_workers-0": repeats(100.0, 10.0, run), "num_workers-2": repeats(130.0, 10.0, run)}
        )
    )
    assert not found["clear"]
    needed = repeats_to_separate(found["best"], found["baseline"])
    assert needed > run
    assert f"about {needed} repeats per cell" in found["wording"]


@pytest.mark.parametrize("run", [2, 3, 5])
def test_at_the_estimated_repeats_the_same_means_and_spread_no_longer_overlap(run):
    """The estimate is about the verdict's own test: rerun with that many repeats at the measured
    means and spreads and the intervals are apart; one repeat fewer (when still more than were run)
    leaves less margin."""
    base, best = repeats(100.0, 10.0, run), repeats(112.0, 8.0, run)
    found = summarize_experiment(rows({"num_workers-0": base, "num_workers-2": best}))
    assert not found["clear"]
    needed = repeats_to_separate(found["best"], found["baseline"])
    again = summarize_experiment(
        rows(
            {
                "num_workers-0": repeats(100.0, 10.0, needed),
                "num_workers-2": repeats(112.0, 8.0, needed),
            }
        )
    )
    assert again["clear"] and again["wording"] == "clear: the 95 % intervals do not overlap"


def test_a_gain_lost_in_noise_asks_for_more_than_a_thousand():
    found = summarize_experiment(
        rows({"num_workers-0": repeats(100.0, 30.0, 3), "num_workers-2": repeats(100.5, 30.0, 3)})
    )
    assert found["wording"].startswith(
        "within noise: the 95 % intervals overlap; more than 1,000 repeats per cell"
    )


def test_wording_for_one_two_and_three_repeats():
    wording = {
        run: summarize_experiment(
            rows(
                {
                    "num_workers-0": repeats(100.0, 10.0, run) if run > 1 else [100.0],
                    "num_workers-2": repeats(110.0, 10.0, run) if run > 1 else [110.0],
                }
            )
        )["wording"]
        for run in (1, 2, 3)
    }
    assert wording[1].startswith(
        "cannot be judged from one run: with fewer than 2 repeats a cell has no interval"
    )
    for run in (2, 3):
        assert wording[run].startswith("within noise: the 95 % intervals overlap; about ")
        assert int(wording[run].split("about ")[1].split()[0]) > run
        assert wording[run].endswith(
            "(a rough power estimate: the intervals apart with 80 % power)"
        )


def test_the_estimate_falls_with_the_spread_and_needs_a_gain():
    def cell(values, name):
        stats = interval(values)
        return {
            "cell": name,
            "n": stats.n,
            "mean": stats.mean,
            "low": stats.low,
            "high": stats.high,
        }

    base = cell([100.0, 110.0, 90.0], "a")
    noisy, quiet = cell([105.0, 125.0, 85.0], "b"), cell([105.0, 106.0, 104.0], "c")
    assert repeats_to_separate(quiet, base) < repeats_to_separate(noisy, base)
    assert repeats_to_separate(base, quiet) is None  # no gain, nothing to separate
    assert gain_wording(base, base, clear=False) == "this is the baseline"
    assert gain_wording(base, quiet, clear=False) == "within noise: the 95 % intervals overlap"


def oversubscribed_rows(trainer_cores: int) -> pd.DataFrame:
    """Issue #39's Lightning job on 2 cores: 2 CPU-bound workers slower than none beside a trainer
    of `trainer_cores` intra-op threads (the summary's columns as analysis.aggregate writes
    them)."""
    out = rows({"num_workers-0": [520.0, 515.0, 525.0], "num_workers-2": [410.0, 405.0, 415.0]})
    two = out["num_workers"] == 1  # rows() numbers the workers by position: the second cell has 2
    out.loc[two, "num_workers"] = 2
    out["trainer_cores"] = trainer_cores
    out["usable_cores"] = 2
    out["demand_cores"] = out["num_workers"].map(lambda w: w + trainer_cores if w else None)
    out["workers_kind"] = out["num_workers"].map(lambda w: "CPU-bound" if w else None)
    out["oversubscribed"] = out["num_workers"].map(
        lambda w: bool(w + trainer_cores > 2) if w else None
    )
    return out


def test_oversubscribed_workers_are_named_as_why_more_workers_do_not_help():
    found = summarize_experiment(oversubscribed_rows(trainer_cores=2))
    assert found["best"]["cell"] == "num_workers-0"
    assert found["cores"] == (
        "more loader workers than the best cell's 0 do not help here, the cores are "
        "oversubscribed: cell num_workers=2 is oversubscribed: its 2 CPU-bound workers and the "
        "trainer's 2 intra-op threads ask for 4 cores of the 2 usable; the workers take the "
        "cores the trainer's threads compute on."
    )
    one_thread = summarize_experiment(oversubscribed_rows(trainer_cores=1))["cores"]
    assert (
        "its 2 CPU-bound workers and the trainer's main process ask for 3 cores of the 2 "
        "usable" in one_thread
    )


def test_no_cores_note_when_the_cells_with_more_workers_fit():
    fits = oversubscribed_rows(trainer_cores=2).assign(oversubscribed=False, usable_cores=8)
    assert summarize_experiment(fits)["cores"] is None
    assert (
        summarize_experiment(
            rows({"num_workers-0": [1.0, 2.0, 3.0], "num_workers-2": [2.0, 3.0, 4.0]})
        )["cores"]
        is None
    )  # no CPU columns: results before issue #24
