"""The scaling study: pytorch_throughput's estimators for the cells that reproduce it, weight decay,
DDP on one node."""

from __future__ import annotations

import statistics

import pytest
from feedbench.analysis.views import builder
from feedbench.harness.loop import Measurement, original_estimators
from helpers.cells import TINY_RESNET
from helpers.summary_rows import RESNET, reference, row, summary, table


def test_the_original_estimators_average_per_step_rates_after_the_first():
    m = Measurement(
        step_starts=[10.0, 10.5, 10.8, 11.2], samples=[32, 32, 32, 32], completed=4, last_done=11.5
    )
    steps = {
        "fwd": [400.0, 100.0, 200.0, 50.0],
        "bwd": [90.0, 150.0, 250.0, 100.0],
        "opt": [10.0, 50.0, 50.0, 60.0],
        "step": [500, 300, 400, 300],
    }
    got = original_estimators(steps, m)
    # the first step dropped
    assert got["fwd_samples_per_s"] == pytest.approx(statistics.fmean([320.0, 160.0, 640.0]))
    assert got["bwd_samples_per_s"] == pytest.approx(statistics.fmean([160.0, 32 / 0.3, 200.0]))
    # all steps over host wall time, no final sync
    assert got["samples_per_s"] == pytest.approx(128 / 1.5)
    assert (
        original_estimators(
            steps, Measurement(step_starts=[1.0], samples=[32], completed=1, last_done=2.0)
        )
        is None
    )


def test_a_naive_cell_records_the_original_estimators(run_cell):
    knobs = dict(TINY_RESNET, scenario="compute", batch_size=2, steps=3, weight_decay=1e-5)
    code, result = run_cell(**knobs, timing="naive", torch_threads=1)
    assert code == 0 and result["status"] == "ok"
    est = result["metrics"]["original_estimators"]
    assert (
        est["fwd_samples_per_s"] > 0 and est["bwd_samples_per_s"] > 0 and est["samples_per_s"] > 0
    )


def test_naive_dataparallel_cells_use_the_original_estimators_and_ddp_cells_ours():
    phases = dict(fwd_ms=100.0, bwd_ms=200.0, opt_ms=20.0)
    rows = []
    for gpus, rate in ((1, 100.0), (2, 190.0)):
        for timing in ("events", "naive"):
            rows.append(
                row(
                    "scaling",
                    f"dp-{gpus}-{timing}",
                    **RESNET,
                    parallel="dp",
                    gpus_per_node=gpus,
                    timing=timing,
                    samples_per_s=rate,
                    **phases,
                    original_fwd_samples_per_s=777.0,
                    original_bwd_samples_per_s=333.0,
                    original_samples_per_s=rate * 1.1,
                )
            )
    rows.append(
        row(
            "scaling",
            "ddp-8-naive",
            **RESNET,
            parallel="ddp",
            gpus_per_node=8,
            timing="naive",
            samples_per_s=700.0,
            **phases,
            original_fwd_samples_per_s=999.0,
            original_samples_per_s=1.0,
        )
    )
    view = builder("scaling")(summary(rows), reference("scaling"), {})
    split = table(view, "Forward and backward throughput").set_index(["GPUs", "parallel"])
    assert (
        split.loc[(2, "dp"), "fwd samples/s (naive)"] == 777.0
        and split.loc[(2, "dp"), "bwd samples/s (naive)"] == 333.0
    )
    assert split.loc[(2, "dp"), "overall samples/s (naive)"] == pytest.approx(209.0)
    assert split.loc[(2, "dp"), "fwd samples/s (events)"] == pytest.approx(
        1000 * 64 / 100.0
    )  # ours: batch / median time
    assert split.loc[(8, "ddp"), "fwd samples/s (naive)"] == pytest.approx(
        1000 * 256 / 100.0
    )  # not the original's cell: ours
    assert "mean of per-step rates" in view.text


def test_the_scaling_preset_has_weight_decay_and_ddp_on_one_node_of_eight():
    from helpers.plans import preset_cells as cells

    full = cells("scaling", "full")
    assert {c.knobs["weight_decay"] for c in full} == {1e-5}
    assert any(
        c.knobs["parallel"] == "ddp" and c.knobs["nodes"] == 1 and c.knobs["gpus_per_node"] == 8
        for c in full
    )
    assert not any(c.knobs["parallel"] == "ddp" and c.knobs["gpus_per_node"] < 8 for c in full)


def test_a_cell_file_with_a_small_float_reads_it_as_a_number(tmp_path):
    """The workflow writes cell.yaml with json.dumps, which spells 1e-5 as 1e-05: YAML 1.1 alone
    would read a string."""
    from feedbench.__main__ import _load_cell

    path = tmp_path / "cell.yaml"
    path.write_text('{"weight_decay": 1e-05, "lr": 2E+1, "momentum": 0.9, "data_dir": "1e5x"}\n')
    assert _load_cell(str(path), ["compute_ms=1e-3"]) == {
        "weight_decay": 1e-5,
        "lr": 20.0,
        "momentum": 0.9,
        "data_dir": "1e5x",
        "compute_ms": 1e-3,
    }
