"""A verdict that never contradicts itself (#49): repeats measured beside other load kept out of its
figures where quiet ones exist, and said where none do; one baseline's repeats behind the wait
share, the free-data factor and the speedups, a factor never above what the wait share allows.

Through the report's own path: summary rows as analysis.aggregate writes them (its CSV read back),
the ceilings joined on the planner's map (aggregate.with_predictions), the report's context and the
terminal's verdict.txt (report.build, verdict_text); and on the stored default run. In-process, no
cell run: about 2 s in all.
"""

from __future__ import annotations

import json
import os
import re

import pandas as pd
import pytest
from feedbench.analysis.aggregate import read_summary, with_predictions
from feedbench.analysis.report import build, verdict_text
from helpers.stored_run import DEFAULT_RUN, default_config
from helpers.summary_rows import summary, verdict_row

# other work's cores on a 2-CPU mask: under and over analysis.other_load's rule
QUIET, BUSY = 0.1, 1.4


def train_row(cell: str, repeat: int, baseline: bool, rate: float, other: float, **values) -> dict:
    """A finished repeat of experiment e on 2 CPUs over a 3 s window, other work taking `other`."""
    return verdict_row(
        cell,
        repeat,
        baseline,
        samples_per_s=rate,
        other_load_cores=other,
        affinity_cores=2,
        window_s=3.0,
        world_size=1,
        **values,
    )


def report(rows: list[dict], links: dict | None = None) -> tuple[dict, str]:
    """The experiment e's section of the report and the terminal's verdict.txt, from these rows."""
    table = summary(rows)
    if links is not None:
        table = with_predictions(table, links)
    context = build(table, [], [], {"experiments": {"e": {"matrix": {"num_workers": [0, 2]}}}}, "h")
    (experiment,) = [e for e in context["experiments"] if e["name"] == "e"]
    return experiment, verdict_text(context["experiments"], context["other_load"])


def test_a_disturbed_repeat_is_left_out_where_quiet_ones_exist_and_the_lines_say_so():
    """The baseline's three repeats, one beside other load at a third of the speed: its median,
    interval and wait share are the two quiet ones', and the Finding and Fix lines say one of three
    was left out."""
    rows = [
        train_row("num_workers-0", 0, True, 100.0, QUIET, num_workers=0, stall_pct=40.0),
        train_row("num_workers-0", 1, True, 102.0, QUIET, num_workers=0, stall_pct=41.0),
        train_row("num_workers-0", 2, True, 35.0, BUSY, num_workers=0, stall_pct=80.0),
        *[
            train_row("num_workers-2", k, False, 150.0 + k, QUIET, num_workers=2, stall_pct=5.0)
            for k in range(3)
        ],
    ]
    experiment, text = report(rows)
    base = next(c for c in experiment["cells"] if c["cell"] == "num_workers-0")
    assert (base["n"], base["left_out"], base["median"]) == (2, 1, 101.0)
    assert base["stall_pct"] == pytest.approx(40.5) and base["low"] > 35.0
    lines = experiment["headline"]
    assert lines["finding"] == (
        "Training waits for data 40 % of each step; 1 of the baseline's 3 repeats ran beside "
        "other load and is left out."
    )
    assert experiment["verdict"]["speedup"] == pytest.approx(151.0 / 101.0)
    assert "; 1 of the baseline's 3 repeats ran beside other load and is left out" in lines["fix"]
    assert "  Finding: Training waits for data 40 % of each step; 1 of the baseline's" in text


def test_an_experiment_whose_baseline_repeats_are_all_disturbed_says_so_on_its_finding_line():
    rows = [
        *[
            train_row("num_workers-0", k, True, 60.0 + k, BUSY, num_workers=0, stall_pct=30.0)
            for k in range(3)
        ],
        *[
            train_row("num_workers-2", k, False, 150.0 + k, QUIET, num_workers=2, stall_pct=5.0)
            for k in range(3)
        ],
    ]
    experiment, text = report(rows)
    finding = experiment["headline"]["finding"]
    assert finding == (
        "Training waits for data 30 % of each step; the baseline has no quiet repeat (all 3 of its "
        "repeats ran beside other load), so its figures are lower than a quiet machine gives."
    )
    assert f"  Finding: {finding}\n" in text
    # and the run's sentence below the lines still names the cell
    said = "Measured beside other load: other work took 1.4 of the 2 CPUs cell num_workers=0 of e"
    assert said in text


def ceiling_rows(compute_other: float) -> list[dict]:
    """Loader and compute ceilings of e's baseline, 3 repeats each, the compute ceiling's beside
    `compute_other` cores of other work; 1000 samples/s of compute, 120 of loader."""
    found = []
    for experiment, scenario, rate, other in (
        ("ceilings-loader", "loader", 120.0, QUIET),
        ("ceilings-compute", "compute", 1000.0, compute_other),
    ):
        for k in range(3):
            row = train_row(scenario, k, False, rate, other, num_workers=0, scenario=scenario)
            found.append({**row, "experiment": experiment})
    return found


LINKS = {
    "e/num_workers-0": {"loader": "ceilings-loader/loader", "compute": "ceilings-compute/compute"}
}


def test_a_ceiling_is_never_divided_by_a_figure_of_another_load_state():
    """The baseline quiet, its compute ceiling measured beside other load (then the reverse): no
    free-data factor is printed, and the line says why. Quiet beside quiet, the factor is the
    ceiling's, capped by the wait share."""
    base = [
        train_row("num_workers-0", k, True, 100.0, QUIET, num_workers=0, stall_pct=60.0)
        for k in range(3)
    ]
    busy_ceiling, _ = report(base + ceiling_rows(BUSY), LINKS)
    assert busy_ceiling["headline"]["finding"] == (
        "Training waits for data 60 % of each step; no free-data factor: its compute ceiling ran "
        "beside other load and the cell did not (rerun both alone)."
    )
    busy_cell = [{**row, "other_load_cores": BUSY} for row in base]
    busy_base, _ = report(busy_cell + ceiling_rows(QUIET), LINKS)
    said = "no free-data factor: its compute ceiling ran on a quiet machine and the cell beside"
    assert said in busy_base["headline"]["finding"]
    quiet, _ = report(base + ceiling_rows(QUIET), LINKS)
    # 1000 / 100 by the ceiling, but 60 % waiting allows 2.5x
    assert quiet["headline"]["finding"].startswith(
        "Training waits for data 60 % of each step; with free data it could run 2.5x faster; its "
        "compute ceiling runs 10.0x its speed, but the rest is the step's own compute"
    )


FACTOR = re.compile(r"could run (\d+(?:\.\d+)?)x faster")


def printed_factors(experiment: dict) -> list[float]:
    """Every free-data factor the experiment's lines and its recommendation print."""
    texts = [v for v in experiment["headline"].values() if isinstance(v, str)]
    texts.append((experiment["verdict"]["recommendation"] or {}).get("sentence") or "")
    return [float(f) for text in texts for f in FACTOR.findall(text)]


@pytest.mark.parametrize("stall", [2.0, 16.0, 40.0, 88.0])
@pytest.mark.parametrize("ceiling", [101.0, 350.0, 5000.0])
def test_a_factor_above_what_its_wait_share_allows_cannot_be_printed(stall, ceiling):
    """The Finding's factor and the recommendation's, whatever the ceiling says: never above
    1 / (1 - wait share) of the same baseline's repeats (to the decimal printed)."""
    base = [
        train_row("num_workers-0", k, True, 100.0 + k, QUIET, num_workers=0, stall_pct=stall)
        for k in range(3)
    ]
    ceilings = [
        {**row, "samples_per_s": ceiling} if row["experiment"] == "ceilings-compute" else row
        for row in ceiling_rows(QUIET)
    ]
    experiment, _ = report(base + ceilings, LINKS)
    allowed = 100 / (100 - stall)
    factors = printed_factors(experiment)
    assert all(f <= round(allowed, 1) for f in factors), (stall, ceiling, factors)
    assert factors or round(min(ceiling / 101.0, allowed), 1) <= 1.0


def test_no_factor_of_the_stored_default_run_is_above_its_baselines_wait_share():
    table = read_summary(os.path.join(DEFAULT_RUN, "summary.csv"))
    with open(os.path.join(DEFAULT_RUN, "ceilings.json")) as f:
        links = json.load(f)
    context = build(table, [], [], default_config(), "default", ceilings=links)
    checked = 0
    for experiment in context["experiments"]:
        base = next(
            (c for c in experiment["cells"] if c["cell"] == experiment["baseline_id"]), None
        )
        if base is None or pd.isna(base.get("stall_pct")) or not experiment["headline"]:
            continue
        allowed = 100 / (100 - base["stall_pct"])
        assert all(f <= round(allowed, 1) for f in printed_factors(experiment)), experiment["name"]
        checked += 1
    assert checked >= 2


def lightning_rows() -> tuple[list[dict], dict]:
    """The Lightning job of #49 in small: 0 workers at 250 samples/s, 2 workers measured slower
    (190) yet predicted at the compute ceiling (409) by a loader ceiling that reaches it; each with
    its loader ceiling, one compute ceiling."""
    rows = [
        *[
            train_row("num_workers-0", k, True, 250.0 + k, QUIET, num_workers=0, stall_pct=20.0)
            for k in range(3)
        ],
        *[
            train_row("num_workers-2", k, False, 190.0 + k, QUIET, num_workers=2, stall_pct=3.0)
            for k in range(3)
        ],
    ]
    for experiment, cell, rate in (
        ("ceilings-loader", "w0", 300.0),
        ("ceilings-loader", "w2", 2000.0),
        ("ceilings-compute", "c", 409.0),
    ):
        scenario = experiment.split("-")[1]
        rows += [
            {**train_row(cell, k, False, rate, QUIET, scenario=scenario), "experiment": experiment}
            for k in range(3)
        ]
    links = {
        f"e/num_workers-{w}": {"loader": f"ceilings-loader/w{w}", "compute": "ceilings-compute/c"}
        for w in (0, 2)
    }
    return rows, links


def test_a_measured_cell_is_never_called_predicted_in_verdict_txt():
    """The ceilings pick 2 workers, which measured half its prediction: the Fix line does not call
    it predicted, the terminal's text says what it measured (the page's why, now in verdict.txt),
    and the report's recommendation gives the measured figure beside the prediction."""
    rows, links = lightning_rows()
    experiment, text = report(rows, links)
    recommendation = experiment["verdict"]["recommendation"]
    assert recommendation["cell"] == "num_workers-2" and recommendation["measured"] == 191.0
    block = text[: text.index("\nceilings-")]
    assert "Predicted, not measured" not in block and "should reach" not in block
    assert "  Fix: No measured cell is faster than the baseline.\n" in block
    assert (
        "  Why: Not the ceilings' pick, 2 workers per GPU: it measured 191 samples/s, 53 % below "
        "its prediction (409)." in block
    )
    assert recommendation["fix"] == (
        "2 workers per GPU measured 191 samples/s, 47 % of the compute ceiling (predicted 409 "
        "samples/s)"
    )


def test_a_prediction_above_its_ceiling_is_never_printed_above_it():
    """A stage what-if's prediction is scaled on its baseline's measured rate, and once read 134 %
    of the compute ceiling: the recommendation caps it at the ceiling."""
    from feedbench.analysis.verdict import recommend

    cells = pd.DataFrame(
        {
            "cell": ["w0", "w2"],
            "num_workers": [0, 2],
            "median": [100.0, None],
            "bound": ["data", "failed"],
            "ceiling_loader": [100.0, 900.0],
            "ceiling_compute": [300.0, 300.0],
            "predicted": [75.0, 402.0],
        }
    )
    records = cells.to_dict("records")
    found = recommend(cells, records[0], records[0])
    assert found["share"] == 1.0 and found["predicted"] == 300.0
    assert found["fix"] == (
        "2 workers per GPU should reach 100 % of the compute ceiling (predicted 300 samples/s)"
    )


def test_waiting_workers_that_take_the_trainers_cores_are_oversubscribed_and_not_predicted():
    """The Lightning job again, as its 2-worker cell ran: its workers waited on a full queue
    (runnable a fifth of the time), yet used 0.4 of a core each beside a trainer of 2 threads on 2
    cores: oversubscribed by the CPU they used (core.cores.crowded), so the ceilings predict no cell
    at the compute ceiling."""
    rows, links = lightning_rows()
    load = {
        "demand_cores": 4,
        "usable_cores": 2,
        "trainer_cores": 2,
        "workers_runnable_share": 0.2,
        "workers_cpu_share": 0.4,
        "workers_kind": "waiting",
        "oversubscribed": False,  # as the harness marked it before it counted the CPU
    }
    rows = [{**r, **load} if r["cell"] == "num_workers-2" else r for r in rows]
    experiment, text = report(rows, links)
    cell = next(c for c in experiment["cells"] if c["cell"] == "num_workers-2")
    assert cell["oversubscribed"] is True
    recommendation = experiment["verdict"]["recommendation"]
    assert recommendation["cell"] is None
    assert (
        "cell num_workers=2 is oversubscribed: its 2 workers and the trainer's 2 intra-op "
        in (recommendation["sentence"])
    )
    assert "compute ceiling" not in text.split("\n  Fix: ")[1].split("\n")[0]


def test_an_interval_never_goes_below_zero_and_says_why_where_it_is_cut():
    """Three repeats of which one ran far slower: the t interval of their mean reaches below zero
    samples/s; the cell table's is cut at 0 and the Fix line says why."""
    rows = [
        *[
            train_row("num_workers-0", k, True, rate, QUIET, num_workers=0, stall_pct=40.0)
            for k, rate in enumerate((100.0, 101.0, 99.0))
        ],
        *[
            train_row("num_workers-2", k, False, rate, QUIET, num_workers=2, stall_pct=5.0)
            for k, rate in enumerate((300.0, 290.0, 12.0))
        ],
    ]
    experiment, text = report(rows)
    best = next(c for c in experiment["cells"] if c["cell"] == "num_workers-2")
    assert best["low"] == 0.0 and best["low_cut"] and best["high"] > 300
    assert min(c["low"] for c in experiment["cells"]) >= 0
    assert (
        "95 % interval 0–" in experiment["headline"]["fix"]
        and "(cut at 0: its repeats spread wider than their mean, so the interval says little)"
        in text
    )


def test_a_gain_of_one_run_says_in_plain_words_what_to_rerun():
    """The README's example runs 1 repeat a cell (a minute on 2 cores): its Fix line cannot judge a
    gain, and says what to rerun to judge it."""
    rows = [
        train_row("num_workers-0", 0, True, 100.0, QUIET, num_workers=0, stall_pct=40.0),
        train_row("num_workers-2", 0, False, 169.0, QUIET, num_workers=2, stall_pct=5.0),
    ]
    experiment, text = report(rows)
    assert experiment["headline"]["fix"] == (
        "No change is clearly faster: the best, num_workers=2, measured 1.69x (169 samples/s), "
        "cannot be judged from one run; set repeats: 3 and rerun to judge 1.69x."
    )
    assert "set repeats: 3 and rerun to judge 1.69x" in text


def test_cells_with_no_quiet_repeat_are_said_once_together_on_the_fix_line():
    rows = [
        train_row("num_workers-0", k, True, 100.0 + k, BUSY, num_workers=0, stall_pct=40.0)
        for k in range(3)
    ] + [
        train_row("num_workers-2", k, False, 102.0 + k, BUSY, num_workers=2, stall_pct=30.0)
        for k in range(3)
    ]
    experiment, _ = report(rows)
    fix = experiment["headline"]["fix"]
    assert fix.count("no quiet repeat") == 1 and fix.endswith(
        "; the baseline and num_workers=2 have no quiet repeat (every repeat of theirs ran beside "
        "other load), so their figures are lower than a quiet machine gives."
    )
