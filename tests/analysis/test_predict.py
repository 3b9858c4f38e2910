"""The prediction of a training cell from its ceilings (analysis.predict, docs/harness.md "The
prediction model").

The calibration workloads (a sleep model and a per-sample delay, tests/helpers/calibration.py) have
known ceilings: a loader of W workers delivers W x B / (B x d) samples/s, the sleep model computes B
/ C. Every case and its ceilings are measured as the workflow measures them, the median of 3 repeats
(a single run on a busy machine can lose 15 % to one burst of other load); the prediction must hold
within 5 %.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from feedbench.analysis.aggregate import load_results
from feedbench.analysis.predict import predict
from feedbench.core.ceilings import batch_bytes, ceiling_knobs


def test_series_without_workers_and_overlap_with_them():
    # 10 samples/s loader, 20 samples/s compute: in series 1/(0.1 + 0.05), beside each other the
    # slower.
    assert predict(10, 20, workers=0, batch=4)[0] == pytest.approx(1 / 0.15)
    terms = pytest.approx({"data": 100, "compute": 50, "transfer": 0})  # ms per sample
    assert predict(10, 20, workers=2, batch=4) == (pytest.approx(10), "data", terms)
    assert predict(40, 20, workers=2, batch=4)[1] == "compute"


def test_copy_in_series_unless_a_stream_prefetches():
    # 1 GB per batch of 10 samples at 1 GB/s: 0.1 s per sample of copy beside 0.05 s of compute.
    assert predict(1000, 20, 2, 10, 1e9, 1.0)[0] == pytest.approx(1 / 0.15)
    terms = pytest.approx({"data": 1, "compute": 50, "transfer": 100})
    assert predict(1000, 20, 2, 10, 1e9, 1.0, stream_prefetch=True) == (
        pytest.approx(10),
        "transfer",
        terms,
    )


def test_no_prediction_without_both_ceilings():
    assert predict(None, 20, 2, 4)[0] is None
    assert predict(10, float("nan"), 2, 4)[0] is None


def test_ceiling_knobs_keep_what_the_ceiling_depends_on():
    train = {
        "scenario": "train",
        "model": "sleep",
        "compute_ms": 5.0,
        "num_workers": 2,
        "pin_memory": True,
        "device_prefetch": "stream",
        "batch_size": 8,
        "dataset": "images",
        "sample_delay_ms": 1.0,
    }
    # no model: an image dataset's samples do not depend on it
    assert ceiling_knobs(train, "loader") == {
        "scenario": "loader",
        "num_workers": 2,
        "pin_memory": True,
        "batch_size": 8,
        "dataset": "images",
        "sample_delay_ms": 1.0,
    }
    assert ceiling_knobs(train, "compute") == {
        "scenario": "compute",
        "model": "sleep",
        "compute_ms": 5.0,
        "batch_size": 8,
        "dataset": "images",
    }
    assert batch_bytes({"model": "mlp", "input_size": 1024, "batch_size": 256}) == 256 * (
        1024 * 4 + 8
    )
    assert batch_bytes({"model": "lstm"}) is None


@pytest.fixture(scope="module")
def calibration(calibration_runs):
    """Summary rows of the 9 calibration cells and their ceilings, 3 repeats each
    (tests/helpers/calibration.py)."""
    return load_results(calibration_runs)


# 54 runs of 1-4 s, one at a time (tests/helpers/calibration.py): about two minutes
@pytest.mark.slow
@pytest.mark.timing  # predicted vs measured samples/s within 5 %
def test_calibration_predicted_within_5_percent(calibration):
    train = calibration[calibration["scenario"] == "train"]
    assert len(train) == 27 and train["predicted_samples_per_s"].notna().all(), train[
        ["cell", "ceiling_loader_samples_per_s"]
    ]
    # of the median repeat
    errors = train.groupby("cell")["prediction_error_pct"].median().astype(float).to_dict()
    assert len(errors) == 9
    assert all(abs(e) <= 5 for e in errors.values()), {k: round(v, 1) for k, v in errors.items()}


@pytest.mark.slow
@pytest.mark.timing  # the measured bound, and the calibration fixture runs once in the timing phase
def test_calibration_bounds(calibration):
    train = (
        calibration[calibration["scenario"] == "train"]
        .drop_duplicates("cell")
        .set_index("cell")["predicted_bound"]
    )
    assert train["compute-bound-2"] == "compute" and train["loader-bound-2"] == "data", (
        train.to_dict()
    )


@pytest.mark.slow
@pytest.mark.timing  # no assertion on time, but it shares the timed calibration fixture
def test_report_shows_predicted_beside_measured(calibration, tmp_path):
    from feedbench.analysis.accuracy import error_summary, predicted_cells
    from feedbench.analysis.aggregate import write_summary
    from feedbench.analysis.report import write_report

    summary, html = tmp_path / "summary.csv", tmp_path / "report" / "index.html"
    write_summary(calibration, str(summary))
    config = {"experiments": {"calibration": {"title": "Calibration workloads"}}}
    write_report(str(summary), [], list(calibration["result"]), config, "c0ffee42", str(html))
    text = html.read_text()
    found = error_summary(predicted_cells(calibration))
    assert found["cells"] == 9
    assert f"9 cells: median error {found['median_pct']:+.1f} %" in text
    assert f"worst {found['worst_pct']:+.1f} %" in text
    section = text[text.index('id="prediction"') :]
    # the figure, with its identity line
    assert "<svg" in section and "identity: measured = predicted" in section
    table = text[text.index('id="exp-calibration"') :]
    # predicted beside measured in the table
    assert "<th title=\"predicted from the cell's ceilings" in table


def test_headspace_and_the_fewest_workers_that_reach_the_compute_ceiling():
    import pandas as pd
    from feedbench.analysis.verdict import recommend

    # Loader ceilings 100, 190, 400 samples/s at 0, 2, 4 workers beside a 200 samples/s compute
    # ceiling.
    cells = pd.DataFrame(
        {
            "cell": ["w0", "w2", "w4"],
            "num_workers": [0, 2, 4],
            "pin_memory": [True] * 3,
            "median": [60.0, 150.0, 195.0],
            "bound": ["data", "data", "compute"],
            "ceiling_loader": [100.0, 190.0, 400.0],
            "ceiling_compute": [200.0] * 3,
            "predicted": [200 / 3, 190.0, 200.0],
        }
    )
    records = cells.to_dict("records")
    found = recommend(cells, records[0], records[2])
    assert found["headspace_baseline"] == pytest.approx(200 / 60 - 1)
    assert found["headspace_best"] == pytest.approx(200 / 195 - 1)
    assert found["cell"] == "w2"  # 190 >= 95 % of 200: two workers are enough
    # w2 was measured: its figure, beside the prediction (#49)
    assert found["sentence"] == (
        "data-bound: with free data, training could run 3.3x faster; 2 workers per GPU with "
        "pinned memory measured 150 samples/s, 75 % of the compute ceiling (predicted 190 "
        "samples/s)"
    )
    # A loader alone fast enough at 0 workers does not feed the model: the main process loads, then
    # trains (the default matrix's decode experiment: 810 samples/s of loader, 518 of compute, 316
    # predicted at 0 workers).
    fast = cells.assign(ceiling_loader=[400.0, 400.0, 400.0])
    assert recommend(fast, records[0], records[2])["cell"] == "w2"
    unreachable = cells.assign(ceiling_loader=[10.0, 20.0, 30.0])
    assert (
        "no measured loader configuration reaches"
        in recommend(unreachable, records[0], records[2])["sentence"]
    )
    assert recommend(cells.assign(predicted=None), records[0], records[2]) is None


def test_what_if_is_the_model_with_doubled_hardware():
    from feedbench.analysis.accuracy import what_if

    # 100 samples/s of loader at 2 workers, 300 of compute; 16 samples of 1,000 features per batch
    # at 1 GB/s in series.
    row = {
        "model": "mlp",
        "dataset": "memory",
        "input_size": 1000,
        "batch_size": 16,
        "num_workers": 2,
        "device_prefetch": "none",
        "ceiling_loader_samples_per_s": 100.0,
        "ceiling_compute_samples_per_s": 300.0,
        "ceiling_copy_gb_per_s": 1.0,
    }
    copy_s = 16 * (1000 * 4 + 8) / 1e9 / 16
    assert what_if(row) == pytest.approx(100)
    # twice the workers' loader, still below the trainer's ~300
    assert what_if(row, cpu=2) == pytest.approx(200)
    # now the loader no longer bounds it
    assert what_if(row, cpu=4) == pytest.approx(1 / (1 / 300 + copy_s))
    assert what_if({**row, "num_workers": 0}, cpu=2) == pytest.approx(
        1 / (1 / 100 + 1 / 300 + copy_s)
    )
    free_data = {**row, "ceiling_loader_samples_per_s": 1e9}
    assert what_if(free_data, copy=2) == pytest.approx(1 / (1 / 300 + copy_s / 2 + 1e-9))


def test_a_cell_above_its_compute_ceiling_is_worded_as_such_not_as_negative_headspace():
    import pandas as pd
    from feedbench.analysis.verdict import recommend

    # The baseline measured 210 samples/s beside a compute ceiling of 200: noise, or a ceiling
    # measured under load.
    cells = pd.DataFrame(
        {
            "cell": ["w0", "w2"],
            "num_workers": [0, 2],
            "median": [210.0, 205.0],
            "bound": ["compute", "compute"],
            "ceiling_loader": [400.0, 800.0],
            "ceiling_compute": [200.0, 200.0],
            "predicted": [133.0, 200.0],
        }
    )
    records = cells.to_dict("records")
    found = recommend(cells, records[0], records[0])
    assert found["headspace_baseline"] == pytest.approx(200 / 210 - 1)
    assert found["sentence"].startswith(
        "compute-bound: measured above its compute ceiling by 5 %: the ceiling is not a bound here"
        " (noise, or a ceiling measured under other load); rerun the ceilings beside it; "
    )
    assert "-5 % headspace" not in found["sentence"]


def test_the_recommendation_says_whether_pinning_and_stream_prefetch_pay_for_themselves():
    import pandas as pd
    from feedbench.analysis.verdict import recommend

    # At 2 workers: pinning gains 20 % with intervals apart; stream prefetch gains 2 % inside the
    # noise.
    rows = [
        ("w2-pin-none", True, "none", 180.0, 175.0, 185.0),
        ("w2-nopin-none", False, "none", 150.0, 146.0, 154.0),
        ("w2-pin-stream", True, "stream", 183.6, 170.0, 197.0),
    ]
    cells = pd.DataFrame(
        [
            {
                "cell": cell,
                "num_workers": 2,
                "pin_memory": pin,
                "device_prefetch": prefetch,
                "median": median,
                "mean": median,
                "low": low,
                "high": high,
                "n": 3,
                "bound": "data",
                "ceiling_loader": 400.0,
                "ceiling_compute": 200.0,
                "predicted": 200.0,
            }
            for cell, pin, prefetch, median, low, high in rows
        ]
    )
    records = cells.to_dict("records")
    found = recommend(cells, records[1], records[2])
    assert found["cell"] == "w2-pin-none"
    assert found["gains"] == [
        "pinning +20 % (95 % intervals 175-185 with, 146-154 without: clear)",
        "stream prefetch +2 % (95 % intervals 170-197 with, 175-185 without: within noise)",
    ]
    assert found["sentence"].endswith("; " + "; ".join(found["gains"]))


SHAPES = {
    "dataset": "shapes.data:build_dataset",
    "dataset_args": {"count": 64, "size": 64, "crop": 56},
    "collate": "shapes.data:collate",
    "model": "shapes.models:build_model",
    "step": "shapes.train:train_step",
    "batch_size": 16,
    "steps": 4,
    "warmup_steps": 1,
    "torch_threads": 1,
}


def own_pipeline_summary(root, device: str, pin_memory: bool):
    """The summary of a real training cell of examples/own-pipeline and its ceilings, each run by
    the harness as the workflow runs it: loader, compute, and the transfer probe of its own batch
    (ceilings.user_probe_knobs)."""
    import os

    from feedbench.core.ceilings import user_probe_knobs
    from feedbench.harness.runner import run

    src = os.path.abspath("examples/own-pipeline/src")
    train = {
        **SHAPES,
        "scenario": "train",
        "device": device,
        "pin_memory": pin_memory,
        "python_path": [src],
    }
    common = {k: train[k] for k in ("steps", "warmup_steps", "torch_threads")}
    cells = {
        "train": train,
        "loader": {**ceiling_knobs(train, "loader"), **common},
        "compute": {**ceiling_knobs(train, "compute"), **common},
        "transfer": {**user_probe_knobs(train), **common, "transfer_sizes": [65536]},
    }
    paths = []
    for name, knobs in cells.items():
        out = root / name / "rep1"
        assert run({**knobs, "experiment": "own", "cell": name, "repeat": 1}, str(out)) == 0, (
            json.loads((out / "result.json").read_text())["error"]
        )
        paths.append(str(out / "result.json"))
    return load_results(paths).set_index("cell")


def test_on_a_cpu_a_user_pipeline_is_predicted_without_a_copy_term(tmp_path):
    # The probe times the user's real batch (the mover's own time on CPU), but a CPU copies nothing:
    # no copy term.
    summary = own_pipeline_summary(tmp_path, "cpu", pin_memory=False)
    probe, train = summary.loc["transfer"], summary.loc["train"]
    # float32 crops, int64 labels
    assert probe["transfer_user_batch_bytes_pageable"] == 16 * (3 * 56 * 56 * 4 + 8)
    assert probe["transfer_user_batch_ms_pageable"] > 0
    assert train["predicted_samples_per_s"] > 0
    assert pd.isna(train["ceiling_copy_gb_per_s"]) and pd.isna(train["ceiling_copy_from"])


@pytest.mark.gpu
@pytest.mark.parametrize("pin_memory", [False, True])
def test_on_a_gpu_a_user_pipelines_copy_term_is_its_real_batch(tmp_path, pin_memory):
    summary = own_pipeline_summary(tmp_path, "cuda", pin_memory)
    probe, train = summary.loc["transfer"], summary.loc["train"]
    kind = "pinned" if pin_memory else "pageable"
    size, ms = probe[f"transfer_user_batch_bytes_{kind}"], probe[f"transfer_user_batch_ms_{kind}"]
    assert train["ceiling_copy_from"] == "user batch"
    assert train["ceiling_copy_gb_per_s"] == pytest.approx(size / (ms / 1000) / 1e9)
    expected, _bound, terms = predict(
        train["ceiling_loader_samples_per_s"],
        train["ceiling_compute_samples_per_s"],
        0,
        16,
        size,
        size / ms / 1e6,
    )
    # ms per sample: the batch's median copy over its samples
    assert terms["transfer"] == pytest.approx(ms / 16)
    assert train["predicted_samples_per_s"] == pytest.approx(expected)


def test_the_copy_term_reads_the_probe_of_the_cells_own_batch_with_its_pinning():
    # Stored results of a GPU run (the real ones are made by the gpu test above): a training cell of
    # the shapes pipeline at 1,000 samples/s of loader (2 workers) and 400 of compute, and two
    # probes of real batches, one of them another crop. The cell pins: its copy term is the pinned
    # batch of its own probe, 8 ms per batch of 16 samples.
    from feedbench.analysis.aggregate import result_row, with_predictions
    from feedbench.core.records import record_of

    def result(cell, scenario, metrics, **knobs):
        knobs = {**SHAPES, "device": "cuda", "pin_memory": True, "scenario": scenario, **knobs}
        return result_row(
            record_of(
                {"status": "ok", "cell": {**knobs, "cell": cell}, "metrics": metrics},
                f"{cell}.json",
            )
        )

    def probe(ms_pinned):
        batches = [
            {"pinned": False, "bytes": 1_000_000, "batch_median_ms": 50.0},
            {"pinned": True, "bytes": 1_000_000, "batch_median_ms": ms_pinned},
        ]
        return {"transfer": {"by_size": [], "user_batch": {"by_pinning": batches}}}

    rows = [
        result("train", "train", {"samples_per_s": 90.0}, num_workers=2),
        result("loader", "loader", {"samples_per_s": 1000.0}, num_workers=2),
        result("compute", "compute", {"samples_per_s": 400.0}, pin_memory=False),
        result("own-probe", "transfer", probe(8.0), model="mlp", step=None),
        result(
            "other-crop",
            "transfer",
            probe(1.0),
            dataset_args={**SHAPES["dataset_args"], "crop": 32},
        ),
    ]
    summary = with_predictions(pd.DataFrame(rows)).set_index("cell")
    train = summary.loc["train"]
    assert train["ceiling_copy_from"] == "user batch"
    assert train["ceiling_copy_gb_per_s"] == pytest.approx(1_000_000 / 0.008 / 1e9)
    # In series with compute (no stream prefetch): 0.5 + 2.5 ms per sample, beside the loader's 1
    # ms.
    assert (
        train["predicted_samples_per_s"] == pytest.approx(1000 / 3)
        and train["predicted_bound"] == "compute"
    )
    pageable = with_predictions(
        pd.DataFrame([{**rows[0], "pin_memory": False}, *rows[1:]])
    ).set_index("cell")
    # Unpinned, its own probe is one with pin_memory false: none here, so no copy term rather than
    # another's.
    assert pd.isna(pageable.loc["train", "ceiling_copy_from"])
