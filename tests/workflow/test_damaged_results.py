"""Nothing lost: damaged results, an interrupted run, a full disk and non-ASCII knobs, on real
Snakemake runs.

Each test runs a copy of the workflow (as tests/workflow/test_workflow.py does), damages
or interrupts it the way a user's machine would, and checks that a plain rerun
redoes exactly what was lost and reports everything.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import ROOT
from feedbench.harness.images import make_images
from helpers.damage import damage
from helpers.snakemake_run import (
    planned,
    snakemake,
    snakemake_command,
    snakemake_env,
    workflow_copy,
)

pytestmark = pytest.mark.slow  # real Snakemake runs: minutes on a busy 2-core machine

FAST = {
    "scenario": "loader",
    "dataset": "synthetic",
    "model": "mlp",
    "input_size": 8,
    "batch_size": 4,
    "num_samples": 64,
}
CONFIG = {
    "defaults": {"repeats": 3, "steps": 3, "warmup_steps": 1, "device": "cpu"},
    "experiments": {
        "loader": {
            "title": "A loader on synthetic vectors",
            "base": FAST,
            "matrix": {"num_workers": [0], "batch_size": [4, 8, 16]},
            "plot": {"x": "batch_size", "y": "samples_per_s", "kind": "line"},
        },
    },
}


DAMAGE = ["truncated", "junk", "no-metrics", "rate-is-text", "negative-stall", "null", "list"]


def _summary(workdir) -> list[dict]:
    with open(workdir / "results" / "summary.csv") as f:
        return list(csv.DictReader(f))


def test_damaged_results_are_reported_failed_then_rerun_alone(tmp_path):
    workflow, workdir = workflow_copy(tmp_path)
    first = snakemake(workflow, workdir, CONFIG)
    assert first.returncode == 0, first.stderr[-4000:]
    cells = workdir / "results" / "cells"
    keys = sorted(str(p.parent.relative_to(cells)) for p in cells.rglob("result.json"))
    assert len(keys) == 9
    # the first len(DAMAGE) cells are damaged (zip stops there), the rest are kept
    damaged, kept = dict(zip(keys, DAMAGE, strict=False)), keys[len(DAMAGE) :]
    before = {
        key: (workdir / "results" / "cells" / key / "result.json").read_bytes() for key in keys
    }
    for key, how in damaged.items():
        (workdir / "results" / "cells" / key / "result.json").write_text(
            damage(before[key].decode(), how)
        )

    # Without retries the damage is reported, not hidden and not a crash: 7 failed rows saying why,
    # 2 measured.
    report_only = dict(CONFIG, retry_failed=False)
    assert planned(workflow, workdir, report_only) == set()
    shown = snakemake(workflow, workdir, report_only)
    # The report is made again and lists them, so the run exits 1 naming each, kept from before.
    assert shown.returncode == 1, shown.stderr[-4000:]
    earlier = r"^(\S+) / (\S+) \(rep(\d+)\): UnusableResult: .*\(an earlier run's result, "
    named = re.findall(earlier, shown.stderr, re.M)
    assert sorted(f"{e}/{c}/rep{k}" for e, c, k in named) == sorted(damaged), shown.stderr[-4000:]
    rows = {f"{r['experiment']}/{r['cell']}/rep{r['repeat']}": r for r in _summary(workdir)}
    assert {k for k, r in rows.items() if r["status"] == "ok"} == set(kept)
    assert {k for k, r in rows.items() if r["status"] == "failed"} == set(damaged)
    assert {rows[k]["error_type"] for k in damaged} == {"UnusableResult"}
    assert "not valid JSON" in rows[keys[0]]["error_message"]
    assert "'fast' is not of type" in rows[keys[3]]["error_message"]
    html = (workdir / "results" / "report" / "index.html").read_text()
    assert "UnusableResult" in html or "unusable result" in html

    # A plain run reruns exactly the damaged cells (a dry run says so first), leaves the others'
    # bytes alone.
    assert planned(workflow, workdir, CONFIG) == set(damaged)
    rerun = snakemake(workflow, workdir, CONFIG)
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    assert set(
        re.findall(r"output: results/cells/(\S+)/result\.json", rerun.stdout + rerun.stderr)
    ) == set(damaged)
    for key in kept:
        assert (workdir / "results" / "cells" / key / "result.json").read_bytes() == before[key]
    for key in damaged:
        result = json.loads((workdir / "results" / "cells" / key / "result.json").read_text())
        assert result["status"] == "ok" and result["cell"]["attempt"].startswith(
            "retry-after-damaged-"
        )
        # issue #36: the damaged bytes kept
        kept_attempt = workdir / "results" / "cells" / key / "attempts" / "1"
        assert (kept_attempt / "result.json").read_text() == damage(
            before[key].decode(), damaged[key]
        )
        assert json.loads((kept_attempt / "attempt.json").read_text())["status"] == "damaged"
    rows = _summary(workdir)
    assert len(rows) == 9 and {r["status"] for r in rows} == {"ok"}
    assert all(float(r["samples_per_s"]) > 0 and 0 <= float(r["stall_pct"]) <= 100 for r in rows)
    assert planned(workflow, workdir, CONFIG) == set()
    assert not list((workdir / "results").rglob("*.tmp"))


def test_a_plain_rerun_after_ctrl_c_completes(tmp_path):
    """Ctrl-C while a cell runs leaves its output marked incomplete; `make run` again must finish it
    without flags."""
    workflow, workdir = workflow_copy(tmp_path)
    slow = dict(FAST, sample_delay_ms=50)  # 4 samples x 50 ms a step: 40 steps take 8 s or more
    config = {
        "defaults": {"repeats": 1, "steps": 40, "warmup_steps": 1, "device": "cpu"},
        "experiments": {"slow": {"base": slow, "matrix": {"num_workers": [0]}}},
    }
    with open(workdir / "config.yaml", "w") as f:
        json.dump(config, f)
    command = snakemake_command(workflow, workdir, "--configfile", str(workdir / "config.yaml"))
    # A terminal's Ctrl-C reaches the whole foreground process group: Snakemake and the job it runs.
    run = subprocess.Popen(
        command,
        env=snakemake_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    started = workdir / "logs" / "bench" / "slow" / "num_workers-0" / "rep1.log"
    deadline = time.monotonic() + 300
    while (
        not (started.exists() and started.stat().st_size)
        and run.poll() is None
        and time.monotonic() < deadline
    ):
        # the harness writes its first line once the cell is resolved: the job is running
        time.sleep(0.2)
    assert run.poll() is None, "the run ended before its cell started: " + run.stdout.read()[-3000:]
    os.killpg(run.pid, signal.SIGINT)
    output = run.communicate(timeout=120)[0]
    assert run.returncode != 0, output[-3000:]
    result = workdir / "results" / "cells" / "slow" / "num_workers-0" / "rep1" / "result.json"
    assert os.listdir(workdir / ".snakemake" / "incomplete") or not result.exists(), output[-3000:]

    rerun = snakemake(workflow, workdir, config)
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    assert "IncompleteFilesException" not in rerun.stderr
    assert json.loads(result.read_text())["status"] == "ok"
    assert (workdir / "results" / "report" / "index.html").exists()


WRITE_UNDER_A_SIZE_LIMIT = textwrap.dedent("""
    import resource, signal, sys
    from feedbench.core.result import write_result
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    try:
        write_result(sys.argv[1], {"status": "ok", "padding": "x" * 100_000})
    except OSError as error:
        print(error.errno)
""")  # noqa: E501


def test_a_write_that_fills_the_disk_leaves_no_temp_file_and_the_old_result(tmp_path):
    """A real failed write (EFBIG under RLIMIT_FSIZE, like ENOSPC on a full disk): old result kept,
    no .tmp left."""
    import errno

    (tmp_path / "result.json").write_text('{"status": "failed"}\n')
    package = os.path.join(ROOT, "workflow")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (package, os.environ.get("PYTHONPATH")) if p),
    )
    proc = subprocess.run(
        [sys.executable, "-c", WRITE_UNDER_A_SIZE_LIMIT, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == str(errno.EFBIG), (
        proc.stdout + proc.stderr
    )
    assert os.listdir(tmp_path) == ["result.json"]
    assert (tmp_path / "result.json").read_text() == '{"status": "failed"}\n'


def test_a_non_ascii_data_dir_reaches_the_cell_intact(tmp_path):
    """`data_dir: img😀` (the folder exists): cell.yaml must carry the emoji, not two lone
    surrogates."""
    workflow, workdir = workflow_copy(tmp_path)
    make_images(str(workdir / "img😀"), count=8, size=24, classes=2)
    config = {
        "defaults": {"repeats": 1, "steps": 2, "warmup_steps": 0, "device": "cpu"},
        "experiments": {
            "emoji": {
                "base": {
                    "scenario": "loader",
                    "dataset": "images",
                    "data_dir": "img😀",
                    "image_size": 16,
                    "batch_size": 4,
                },
                "matrix": {"num_workers": [0]},
            }
        },
    }
    run = snakemake(workflow, workdir, config)
    assert run.returncode == 0, run.stderr[-4000:]
    folder = workdir / "results" / "cells" / "emoji" / "num_workers-0" / "rep1"
    result = json.loads((folder / "result.json").read_text())
    assert result["status"] == "ok", result["error"]
    assert result["cell"]["data_dir"] == "img😀" and "img😀" in (folder / "cell.yaml").read_text(
        encoding="utf-8"
    )
    assert planned(workflow, workdir, config) == set()
