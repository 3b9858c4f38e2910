"""Each experiment's verdict in three plain lines: the finding, where, the fix, measured or
predicted.

On the default run's results (tests/stored/default-run): its `decode` experiment is data-bound at 0
workers, names its costliest stage, measured the cache the stage profile predicts (cache_after:
decode) and ran the worker count the ceilings pick, oversubscribed on 2 cores. Crafted rows check
what that run does not have: a fastest cell that is oversubscribed, and a pipeline that counts
tokens.
"""

from __future__ import annotations

import json
import os
import re

import pandas as pd
import pytest
from feedbench.analysis import headline, stages
from feedbench.analysis.aggregate import read_summary
from feedbench.analysis.plots import plot_experiment
from feedbench.analysis.report import build, fmt, target_in_units
from feedbench.analysis.verdict import summarize_experiment
from helpers.stored_run import DEFAULT_RUN, default_config
from helpers.summary_rows import verdict_row


@pytest.fixture(scope="module")
def default():
    """The default run's summary and the report's context of each of its experiments."""
    summary = read_summary(os.path.join(DEFAULT_RUN, "summary.csv"))
    with open(os.path.join(DEFAULT_RUN, "ceilings.json")) as f:
        links = json.load(f)
    context = build(summary, [], [], default_config(), "default", ceilings=links)
    return summary, {e["name"]: e for e in context["experiments"]}


def test_every_experiment_has_three_plain_lines(default):
    _, experiments = default
    assert set(experiments) == {"decode", "workers", "prefetch", "compute", "transfer"}
    for name, e in experiments.items():
        lines = e["headline"]
        assert all(lines[k] and lines[k].endswith(".") for k in ("finding", "where", "fix")), (
            name,
            lines,
        )
        assert "headspace" not in " ".join(v for v in lines.values() if isinstance(v, str)), (
            name,
            lines,
        )


def test_a_data_bound_experiment_says_how_much_it_waits_and_how_much_faster_free_data_would_be(
    default,
):
    _, experiments = default
    decode = experiments["decode"]
    base = next(c for c in decode["cells"] if c["cell"] == decode["baseline_id"])
    faster = base["ceiling_compute"] / base["median"]
    assert decode["headline"]["finding"] == (
        f"Training waits for data {base['stall_pct']:.0f} % of each step;"
        f" with free data it could run {faster:.1f}x faster."
    )


def test_the_where_line_is_the_stage_summary_of_the_baseline(default):
    summary, experiments = default
    decode = experiments["decode"]
    rows = summary[(summary["cell"] == decode["baseline_id"]) & (summary["status"] == "ok")]
    culprit = stages.culprit(rows)
    assert culprit and decode["headline"]["where"] == f"{culprit[0].upper()}{culprit[1:]}."


def test_a_measured_cache_is_the_fix_measured_with_its_prediction_error(default):
    _, experiments = default
    decode = experiments["decode"]
    best = next(c for c in decode["cells"] if c["cell"] == decode["best_id"])
    assert best["cell"] == "num_workers-0_cache_after-decode"
    side = "above" if best["error_pct"] >= 0 else "below"
    assert decode["headline"]["fix"].startswith(
        f"cache_after=decode: measured {best['speedup']:.2f}x ("
    )
    assert (
        f"{abs(best['error_pct']):.1f} % {side} its prediction ({fmt(best['predicted'])} "
        "samples/s predicted)" in (decode["headline"]["fix"])
    )


def test_a_cell_that_oversubscribes_its_cores_is_not_predicted_at_the_compute_ceiling(default):
    """#49: the decode experiment's 1 and 2 workers reach the compute ceiling by their loader
    ceilings, but beside the trainer's 2 threads they ask for 3 and 4 of the 2 cores (and measured
    18 % under the prediction that ignores it): neither is the ceilings' pick, and the sentence says
    why no prediction is given."""
    _, experiments = default
    decode = experiments["decode"]
    cells = {c["cell"]: c for c in decode["cells"]}
    assert cells["num_workers-1"]["oversubscribed"] and cells["num_workers-2"]["oversubscribed"]
    recommendation = decode["verdict"]["recommendation"]
    assert recommendation["cell"] is None and "should reach" not in recommendation["sentence"]
    assert recommendation["sentence"].endswith(
        "no measured loader configuration reaches the compute ceiling and leaves the trainer its "
        "cores (cell num_workers=1 cache_after=none is oversubscribed: its 1 CPU-bound worker "
        "and the trainer's 2 intra-op threads ask for 3 cores of the 2 usable: no prediction is "
        "given for it, the trainer's threads wait for the cores its workers take)"
    )
    assert decode["headline"]["why"] is None  # no pick to explain


def test_a_pick_that_is_the_baseline_says_the_ceilings_saw_no_change_beat_it():
    """Where the ceilings' pick is the baseline itself, "Not the ceilings' pick, cell <baseline>"
    read as if another cell had been picked (a new user's sensor pipeline, where a measured cache
    beat it)."""
    cells = pd.DataFrame(
        [{"cell": "base", "median": 414.0, "error_pct": -17.0}, {"cell": "cached", "median": 519.0}]
    )
    found = {
        "best": {"cell": "cached"},
        "baseline": {"cell": "base"},
        "cells": cells,
        "recommendation": {"cell": "base", "how": "cell base", "predicted": 499.0},
    }
    assert headline.why_not(found, "samples/s", fmt) == (
        "The ceilings predicted no change beats the baseline: it measured 414 samples/s, 17 % "
        "below its prediction (499)."
    )


def rows(cells: dict[str, dict], repeats: int = 3) -> pd.DataFrame:
    """Summary rows of one training experiment from crafted medians; the first cell is the labelled
    baseline."""
    out = []
    for i, (cell, knobs) in enumerate(cells.items()):
        for repeat in range(repeats):
            jitter = 1 + 0.01 * (repeat - 1)
            rate = knobs["samples_per_s"] * jitter
            tokens = {"tokens_per_s": rate * knobs["tokens"]} if "tokens" in knobs else {}
            out.append(
                verdict_row(cell, repeat, i == 0, **{**knobs, "samples_per_s": rate}, **tokens)
            )
    return pd.DataFrame(out).drop(columns="tokens", errors="ignore")


def test_a_fastest_cell_that_is_oversubscribed_is_the_fix_and_the_verdict_says_so():
    found = summarize_experiment(
        rows(
            {
                "num_workers-0": {"num_workers": 0, "samples_per_s": 100.0, "stall_pct": 60.0},
                "num_workers-1": {"num_workers": 1, "samples_per_s": 150.0, "stall_pct": 30.0},
                "num_workers-2": {
                    "num_workers": 2,
                    "samples_per_s": 190.0,
                    "stall_pct": 12.0,
                    "oversubscribed": True,
                    "demand_cores": 3.0,
                    "usable_cores": 2.0,
                },
            }
        )
    )
    lines = headline.lines(found, pd.DataFrame({"scenario": ["train"]}), "samples/s", [], fmt)
    assert found["best"]["cell"] == "num_workers-2"
    assert lines["fix"].startswith("num_workers=2: measured 1.90x (190 samples/s")
    assert lines["why"] == (
        "The fastest cell is oversubscribed (cell num_workers=2 is oversubscribed: its 2 "
        "CPU-bound workers and the trainer's main process ask for 3 cores of the 2 usable): it "
        "holds only while nothing else needs those cores."
    )


def token_rows() -> pd.DataFrame:
    """A pipeline that counts tokens (10 a sample), predicted from its ceilings: 0 workers
    data-bound, 2 not."""
    predicted = {"ceiling_compute_samples_per_s": 300.0}
    return rows(
        {
            "num_workers-0": {
                "num_workers": 0,
                "samples_per_s": 100.0,
                "tokens": 10,
                "stall_pct": 60.0,
                "predicted_samples_per_s": 110.0,
                "ceiling_loader_samples_per_s": 100.0,
                "prediction_error_pct": -9.1,
                "predicted_bound": "data",
                **predicted,
            },
            "num_workers-2": {
                "num_workers": 2,
                "samples_per_s": 280.0,
                "tokens": 10,
                "stall_pct": 5.0,
                "predicted_samples_per_s": 290.0,
                "ceiling_loader_samples_per_s": 400.0,
                "prediction_error_pct": -3.4,
                "predicted_bound": "compute",
                **predicted,
            },
        }
    )


def test_where_the_pipeline_counts_tokens_every_figure_is_in_tokens_per_s():
    found = summarize_experiment(token_rows())
    assert found["metric"] == "tokens_per_s"
    cells = found["cells"].set_index("cell")
    # 290 samples/s of 10 tokens
    assert cells.loc["num_workers-2", "predicted"] == pytest.approx(2900)
    assert cells.loc["num_workers-2", "ceiling_compute"] == pytest.approx(3000)
    assert found["recommendation"]["fix"].endswith("(predicted 2,900 tokens/s)")
    lines = headline.lines(found, pd.DataFrame({"scenario": ["train"]}), "tokens/s", [], fmt)
    # 60 % waiting allows at most 2.5x, whatever the compute ceiling says (verdict.free_data)
    assert lines["finding"] == (
        "Training waits for data 60 % of each step; with free data it could run 2.5x faster; its "
        "compute ceiling runs 3.0x its speed, but the rest is the step's own compute, slower in "
        "training than alone (other load, or loader workers on its cores)."
    )
    assert lines["fix"].startswith("num_workers=2: measured 2.80x (2,800 tokens/s, 95 % interval ")
    assert lines["fix"].endswith("3.4 % below its prediction (2,900 tokens/s predicted).")
    assert not re.search("samples/s", " ".join(v for v in lines.values() if isinstance(v, str)))


def test_where_the_pipeline_counts_tokens_every_section_is_in_tokens_per_s(tmp_path):
    """One unit per experiment (verdict.unit) in every section: its table and what-ifs, the
    prediction section, the target section (whose estimate counts samples/s) and its plot's axis;
    none says samples/s for it."""
    summary = token_rows()
    spec = {
        "matrix": {"num_workers": [0, 2]},
        "plot": {"x": "num_workers", "y": "samples_per_s", "kind": "bar"},
    }
    svg = str(tmp_path / "e.svg")
    plot_experiment(summary, "e", spec["plot"], svg)
    context = build(summary, [svg], [], {"experiments": {"e": spec}}, "h")
    (experiment,) = context["experiments"]
    assert experiment["unit"] == "tokens/s"
    prediction = {row["cell"]: row for row in context["prediction"]["rows"]}
    assert prediction["num_workers-2"]["unit"] == "tokens/s"
    # the median repeat's tokens/s
    assert prediction["num_workers-2"]["measured"] == pytest.approx(2800)
    # 290 samples/s of 10 tokens
    assert prediction["num_workers-2"]["predicted"] == pytest.approx(2900)
    # the same in either unit
    assert prediction["num_workers-2"]["error_pct"] == pytest.approx(-3.4)
    target = target_in_units(
        {"rows": [{"cell": "e/num_workers-2", "predicted": 500.0, "compute_ceiling": 600.0}]},
        summary,
    )
    assert target["rows"] == [
        {
            "cell": "e/num_workers-2",
            "predicted": pytest.approx(5000),
            "compute_ceiling": pytest.approx(6000),
            "unit": "tokens/s",
        }
    ]
    with open(svg) as f:
        drawn = f.read()
    assert (
        "[tokens/s]" in drawn and "tokens_per_s by num_workers" in drawn and "samples" not in drawn
    )


def test_the_what_ifs_show_each_cells_fastest_three_and_fold_the_rest(default):
    _, experiments = default
    whatifs = experiments["decode"]["whatifs"]
    for cell in {w["cell"] for w in whatifs}:
        own = [w for w in whatifs if w["cell"] == cell]
        fastest = sorted(own, key=lambda w: -w["predicted"])[:3]
        assert [w for w in own if w["shown"]] == fastest and len(own) > 3, cell


def test_the_trainers_device_work_is_named_with_its_fix_where_it_is_large():
    """N1 (#35): device_prep, the trainer's device work on each batch, is not the loader's wait: a
    cell that spends 30 % of its step there is compute-bound by the stall rule, and its why and
    where lines name device_prep and its fix; at 5 % neither does."""
    found = summarize_experiment(
        rows(
            {
                "device_stages-Normalize": {
                    "samples_per_s": 100.0,
                    "stall_pct": 2.0,
                    "device_prep_share": 0.30,
                },
                "device_stages-none": {
                    "samples_per_s": 120.0,
                    "stall_pct": 3.0,
                    "device_prep_share": 0.05,
                },
            }
        )
    )
    cells = found["cells"].set_index("cell")
    moved, kept = cells.loc["device_stages-Normalize"], cells.loc["device_stages-none"]
    assert moved["bound"] == "compute" and "device_prep" not in kept["why"]
    assert moved["why"].endswith(
        "; the trainer's device work on each batch (device_prep: device_stages, GPU decode) "
        "takes 30 % of each step: the trainer's time, not the loader's, so more workers cannot "
        "help; move the stages back to the loader's workers, or overlap them with the step on a "
        "side stream"
    )
    lines = headline.lines(found, pd.DataFrame({"scenario": ["train"]}), "samples/s", [], fmt)
    assert lines["where"].startswith("In the model's step") and lines["where"].endswith(
        "Also the trainer's device work on each batch (device_prep: device_stages, GPU decode) "
        "takes 30 % of each step: the trainer's time, not the loader's, so more workers cannot "
        "help; move the stages back to the loader's workers, or overlap them with the step on a "
        "side stream."
    )


def test_the_terminals_verdict_names_cells_in_words_never_by_folder_id(default):
    """#49: verdict.txt (the Time lost line, the why, the recommendation) names each cell by its
    report label (`num_workers=2 pin_memory=false`), never by its folder id
    (`num_workers-2_pin_memory-false`), ceilings included."""
    from feedbench.analysis.report import verdict_text

    summary, experiments = default
    text = verdict_text(list(experiments.values()))
    recommendations = " ".join(
        (e["verdict"]["recommendation"] or {}).get("sentence") or ""
        for e in experiments.values()
        if e["verdict"]
    )
    ids = {cell for cell in summary["cell"].unique() if "-" in cell}
    assert ids and not [cell for cell in ids if cell in text or cell in recommendations]
    assert "best cell num_workers=2 pin_memory=false: the first batch" in text


def test_a_first_batch_without_workers_is_not_blamed_on_worker_start_up(default):
    """#49: the workers experiment's baseline runs 0 workers: its first batch is the main process
    making it; its best cell's, 2 workers', is their start-up."""
    _, experiments = default
    lost = experiments["workers"]["verdict"]["time_lost"]
    assert "baseline num_workers=0 pin_memory=false: the first batch took " in lost
    assert "% of the run (the main process making it)" in lost
    assert "best cell num_workers=2 pin_memory=false: the first batch took " in lost
    assert lost.count("(worker start-up)") == 1
