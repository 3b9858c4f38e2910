"""Every scenario, dataset and model family runs and writes a result that validates against the
schema."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import jsonschema
import pytest
import torch
from feedbench.core.metric_table import undeclared
from feedbench.core.result import schema
from feedbench.harness.images import make_images
from helpers.cells import (
    ENDLESS_SLEEP,
    TINY_LOADER,
    TINY_MLP,
    TINY_RESNET,
    jpeg_cell,
    start_cell,
)


def validate(result: dict) -> None:
    jsonschema.validate(result, schema())
    assert not undeclared(result), (
        f"metrics measured but not declared in core.metric_table: {undeclared(result)}"
    )


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    make_images(str(root), count=32, size=40, classes=4)
    return root


# The nmt study's model, tiny: an LSTM language model over 12 tokens.
TINY_LSTM = dict(
    model="lstm",
    dataset="tokens",
    seq_len=12,
    vocab_size=50,
    embedding_dim=8,
    hidden_size=8,
    batch_size=4,
    steps=3,
    warmup_steps=1,
)


@pytest.mark.parametrize(
    "knobs",
    [
        pytest.param(dict(TINY_MLP, dataset="synthetic"), id="train-mlp-synthetic"),
        pytest.param(
            dict(
                TINY_MLP,
                dataset="memory",
                num_workers=1,
                prefetch_factor=3,
                persistent_workers=True,
            ),
            id="train-mlp-memory-worker",
        ),
        pytest.param(dict(TINY_MLP, scenario="compute"), id="compute-mlp"),
        pytest.param(
            dict(TINY_LOADER, model="none", steps=4, num_workers=2, in_order=False), id="loader"
        ),
        pytest.param(
            dict(TINY_RESNET, amp="bf16", channels_last=True), id="resnet18-bf16-channels-last"
        ),
        pytest.param(dict(TINY_MLP, amp="fp16"), id="mlp-fp16-gradscaler"),
        pytest.param(dict(TINY_MLP, timing="sync", epochs=1, num_samples=24), id="epochs-sync"),
        pytest.param(
            dict(TINY_MLP, timing="naive", multiprocessing_context="spawn", num_workers=1),
            id="naive-spawn",
        ),
        pytest.param(
            dict(TINY_LSTM, lstm_impl="fused"),
            id="lstm-fused",
        ),
        pytest.param(
            dict(TINY_LSTM, lstm_impl="cell"),
            id="lstm-cell",
        ),
    ],
)
def test_cell_runs_and_validates(run_cell, knobs):
    code, result = run_cell(**knobs)
    assert code == 0, result["error"]
    validate(result)
    metrics = result["metrics"]
    assert result["status"] == "ok" and metrics["samples_per_s"] > 0
    assert metrics["steps"] == (3 if knobs.get("epochs") else knobs["steps"])
    assert metrics["time_to_first_batch_s"] > 0
    if knobs.get("dataset") == "tokens":
        assert metrics["tokens_per_s"] > metrics["samples_per_s"]


def test_images_dataset_decodes_real_jpegs(run_cell, image_dir):
    code, result = run_cell(
        **jpeg_cell(image_dir, num_classes=4, batch_size=8, steps=3, num_workers=2)
    )
    assert code == 0, result["error"]
    validate(result)
    assert result["metrics"]["samples"] == 24


def test_tokens_count_true_lengths(run_cell, tmp_path):
    knobs = dict(TINY_LSTM, seq_len=10, seq_len_spread=0.5, vocab_size=30, steps=5, warmup_steps=0)
    code, result = run_cell(**knobs, shuffle=False)
    assert code == 0
    out = [p for p in tmp_path.iterdir() if (p / "steps.csv").exists()][0]
    rows = list(csv.DictReader(open(out / "steps.csv")))
    from feedbench.harness.data import TokenDataset

    lengths = TokenDataset(2048, 10, 0.5, 30, 0).lengths
    assert [int(r["tokens"]) for r in rows] == [
        int(lengths[4 * i : 4 * i + 4].sum()) for i in range(5)
    ]


def test_transfer_probe(run_cell):
    code, result = run_cell(
        scenario="transfer", transfer_sizes=[65536, 1048576], steps=3, warmup_steps=1
    )
    assert code == 0, result["error"]
    validate(result)
    sizes = result["metrics"]["transfer"]["by_size"]
    assert [s["size_bytes"] for s in sizes] == [65536, 1048576]
    assert all(s["median_gb_per_s"] > 0 for s in sizes)


def test_profile_writes_chrome_trace(run_cell, tmp_path):
    code, result = run_cell(**TINY_MLP, profile=True, profile_steps=2)
    assert code == 0
    trace = next(tmp_path.glob("*/trace.json"))
    assert "traceEvents" in json.loads(trace.read_text())
    assert result["files"]["trace"] == "trace.json"


def test_warmup_excluded_and_steps_csv_matches(run_cell, tmp_path):
    code, result = run_cell(**dict(TINY_MLP, steps=7, warmup_steps=3))
    rows = list(csv.DictReader(open(next(tmp_path.glob("*/steps.csv")))))
    assert len(rows) == 7 == result["metrics"]["steps"]
    assert {"wait_ms", "h2d_ms", "fwd_ms", "bwd_ms", "opt_ms", "step_ms", "samples"} <= set(rows[0])
    assert sum(float(r["step_ms"]) for r in rows) == pytest.approx(
        result["metrics"]["window_s"] * 1000, rel=1e-6
    )


def test_provenance_is_an_allow_list(run_cell, monkeypatch):
    monkeypatch.setenv("FEEDBENCH_TEST_SECRET", "hunter2")
    code, result = run_cell(**TINY_MLP)
    assert "hunter2" not in json.dumps(result)
    assert {"host", "cpu", "torch", "torchvision", "python", "git_commit"} <= set(
        result["provenance"]
    )


def test_provenance_names_torchvision_without_importing_it():
    """Importing torchvision (and with it torch._dynamo) cost every cell about 1.1 s of CPU for one
    version string."""
    check = (
        "import importlib.metadata, sys, torch; from feedbench.harness.provenance import "
        "machine_facts; facts = machine_facts(torch.device('cpu')); assert facts['torchvision'] "
        "== importlib.metadata.version('torchvision'), facts; assert 'torchvision' not in "
        "sys.modules, 'machine_facts imported torchvision'"
    )
    proc = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_cell_without_torchvision_transforms_does_not_import_torchvision(tmp_path):
    """Looking for the Composes to time (harness.stages) imported torchvision in every cell: about
    1.5 s of CPU a loader cell over synthetic data. A real cell, stage timing on, in a process of
    its own."""
    knobs = dict(TINY_LOADER, num_samples=32, torch_threads=1, device="cpu", stage_timing=True)
    check = (
        "import json, sys; from feedbench.harness.runner import run; "
        "assert run(json.loads(sys.argv[1]), sys.argv[2]) == 0; "
        "assert 'torchvision' not in sys.modules, 'the cell imported torchvision'"
    )
    command = [sys.executable, "-c", check, json.dumps(knobs), str(tmp_path / "out")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_monitor_samples_and_notes_missing_gpu(run_cell):
    # >= 3 samples of a 0.02 s monitor over 10 sleeps of 20 ms (~10 expected): a busy core only
    # lengthens the window.
    code, result = run_cell(
        model="sleep",
        compute_ms=20,
        image_size=8,
        batch_size=2,
        steps=10,
        warmup_steps=0,
        num_workers=1,
        monitor_interval_s=0.02,
        torch_threads=1,
    )
    monitor = result["monitor"]
    assert monitor["samples"] >= 3
    assert monitor["stats"]["trainer_rss_mb"]["max"] > 10
    assert monitor["stats"]["workers_pss_mb"]["max"] > 0
    if not result["provenance"]["gpu"]:
        assert any("no GPU" in note for note in monitor["notes"])


def test_crash_inside_loop_writes_failed_result_keeping_measured_steps(run_cell, tmp_path):
    root = tmp_path / "images"
    make_images(str(root), count=16, size=32, classes=2)
    victims = sorted((root / "train").rglob("*.JPEG"))
    victims[-1].write_bytes(b"not a jpeg at all")  # the last sample read (no shuffle) is corrupt
    code, result = run_cell(
        **jpeg_cell(
            root, image_size=16, num_classes=2, batch_size=2, steps=8, shuffle=False, num_workers=1
        )
    )
    assert code == 1
    validate(result)
    assert result["status"] == "failed"
    assert result["error"]["type"] in ("UnidentifiedImageError", "RuntimeError")
    assert "cannot identify image file" in result["error"]["message"] + result["error"]["traceback"]
    # steps 1..6 finished; the 7th batch holds the corrupt file
    assert result["metrics"]["steps"] == 6


# A training step of the user's (knob `step`) that marks each call in a file beside it: the test
# sees the harness measuring, whatever the load, instead of guessing how long starting takes.
MARKING_STEP = """
import pathlib, time

MARKS = pathlib.Path(__file__).with_name("steps-done")


def step(model, batch, ctx):
    time.sleep(0.05)
    with open(MARKS, "a") as f:
        f.write(".")
"""


def test_sigterm_writes_failed_result(tmp_path):
    out = tmp_path / "out"
    user = tmp_path / "user"
    user.mkdir()
    (user / "marking.py").write_text(MARKING_STEP)
    marks = user / "steps-done"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cell = dict(ENDLESS_SLEEP, step="marking:step", python_path=[str(user)], warmup_steps=0)
    proc = start_cell(out, cell, stderr=subprocess.PIPE, text=True, env=env)
    # SIGTERM once two measured steps are done (warm-up 0), however long importing torch and
    # starting took.
    deadline = time.monotonic() + 300
    while not (marks.exists() and len(marks.read_text()) >= 2):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the harness did not measure a step within 300 s"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 1, proc.stderr.read()
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "failed" and result["error"]["type"] == "Terminated"
    assert result["metrics"]["steps"] > 0


def _hand_over_from(queue, ready):
    # shared memory: the receiver asks this process's resource sharer for its fd
    queue.put(torch.ones(1000))
    ready.wait()


def test_a_worker_dead_mid_hand_over_is_named_in_one_line():
    """A batch whose worker died before the main process took its shared memory fails in the
    hand-over with a bare connection error (EOFError, or refused or reset); the cell's error says a
    loader worker died there. Real processes: a tensor put on a torch.multiprocessing queue, its
    sender killed, then received."""
    import torch.multiprocessing as mp
    from feedbench.harness.runner import error_record

    context = mp.get_context("fork")
    queue, ready = context.Queue(), context.Event()
    sender = context.Process(target=_hand_over_from, args=(queue, ready))
    sender.start()
    deadline = time.monotonic() + 60
    while queue.empty() and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(sender.pid, signal.SIGKILL)
    sender.join()
    with pytest.raises((EOFError, ConnectionError)) as raised:
        queue.get(timeout=30)
    error = error_record(raised.value)
    assert error["message"].startswith("a loader worker died while handing over a batch (")
    assert error["type"] in ("EOFError", "ConnectionRefusedError", "ConnectionResetError")
    # an EOFError elsewhere is left as it came
    assert error_record(EOFError())["message"] == "EOFError"


def test_killed_worker_writes_failed_result(tmp_path):
    import psutil

    out = tmp_path / "out"
    proc = start_cell(
        out, dict(ENDLESS_SLEEP, compute_ms=20, num_workers=1), stderr=subprocess.PIPE, text=True
    )
    parent = psutil.Process(proc.pid)

    def loader_workers() -> list:
        """The cell's forked DataLoader workers (its command line): not a short-lived child such as
        provenance's `git`, which a loaded machine can show first, so the kill found no worker and
        the cell ran on."""
        found = []
        for child in parent.children():
            try:
                if child.cmdline() == parent.cmdline():
                    found.append(child)
            except psutil.NoSuchProcess:
                continue
        return found

    deadline = time.time() + 60
    while time.time() < deadline and not loader_workers():
        time.sleep(0.2)
    time.sleep(2)
    workers = loader_workers()
    assert workers, "no loader worker to kill"
    for worker in workers:
        worker.kill()
    assert proc.wait(timeout=60) == 1
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "failed"
    # PyTorch reports the death as "worker ... exited unexpectedly"; a batch half-received from the
    # dead worker ends in a bare EOFError or reset connection, which the harness names
    # (runner.HAND_OVER).
    message = result["error"]["message"]
    assert any(
        text in message
        for text in ("exited unexpectedly", "killed by signal", "died while handing over")
    ), result["error"]
    assert (
        "dataloader" in result["error"]["traceback"].lower()
        or "reductions" in result["error"]["traceback"]
    )
    assert result["metrics"]["steps"] > 0


def test_out_of_memory_writes_failed_result(run_cell):
    # a 4 TiB weight
    code, result = run_cell(model="mlp", input_size=2**20, width=2**20, batch_size=2, steps=2)
    assert code == 1
    assert result["status"] == "failed"
    assert "allocate" in result["error"]["message"]


def test_record_failure_for_a_harness_killed_without_a_result(tmp_path):
    out = tmp_path / "out"
    cell = tmp_path / "cell.yaml"
    cell.write_text("model: sleep\ncompute_ms: 20\nimage_size: 8\nbatch_size: 2\nsteps: 100000\n")
    log = tmp_path / "harness.log"
    with open(log, "w") as f:
        proc = start_cell(out, cell=cell, stdout=f, stderr=subprocess.STDOUT)
        time.sleep(5)
        proc.kill()  # SIGKILL: the harness gets no chance to write anything
        code = proc.wait(timeout=30)
    assert not (out / "result.json").exists()
    rec = subprocess.run(
        [
            sys.executable,
            "-m",
            "feedbench",
            "record-failure",
            str(out),
            "--exit-code",
            str(128 - code),
            "--cell",
            str(cell),
            "--log",
            str(log),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rec.returncode == 0, rec.stderr
    result = json.loads((out / "result.json").read_text())
    validate(result)
    assert result["status"] == "failed" and result["error"]["type"] == "Killed"
    assert (
        result["error"]["message"] == "the harness exited with code 137 (signal SIGKILL) "
        "without writing a result"
    )
    assert result["requested"]["model"] == "sleep"


def test_torch_threads_knob_is_applied_and_recorded(run_cell):
    code, result = run_cell(**TINY_MLP, torch_threads=1)
    assert code == 0 and result["torch_threads"] == 1


def test_a_dataset_smaller_than_a_batch_says_so_in_adjustments(run_cell):
    """5 samples and batch_size 8: every batch holds 5, and the result says why instead of running
    them silently."""
    loader = dict(TINY_LOADER, dataset="memory", model="mlp", input_size=4, steps=3, warmup_steps=1)
    code, result = run_cell(**loader, num_samples=5)
    assert code == 0, result["error"]
    assert result["metrics"]["samples"] == 3 * 5
    assert (
        "batch_size=8 ran as batches of 5: the dataset has fewer samples than one batch"
        in result["adjustments"]
    )
    code, result = run_cell(**loader, num_samples=20)
    assert code == 0 and result["metrics"]["samples"] == 3 * 8
    assert not [note for note in result["adjustments"] if "batch_size" in note]
