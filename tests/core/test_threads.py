"""The trainer's threads follow the launch: PyTorch's default in one process, OMP_NUM_THREADS where
the environment sets it, 1 per rank of a multi-rank cell as torchrun gives it, the knob over all
three; and under Snakemake the threads of the workflow's launch, not the job's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jsonschema
import pytest
from feedbench.core import threads
from feedbench.core.result import schema
from helpers.cells import run_cell_process, tiny_mlp

TINY_MLP = tiny_mlp(device="cpu")


def plain_env(**names: str) -> dict:
    """This environment as a plain shell's, without any thread variable (nor the launcher's mark),
    plus `names`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in threads.SNAKEMAKE_SETS and k != threads.TORCHRUN_MARK
    }
    return {**env, **names}


def pytorch_default(env: dict) -> int:
    """torch.get_num_threads() of a fresh process in `env`: what `python train.py` would get
    there."""
    code = "import torch; print(torch.get_num_threads())"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    return int(done.stdout)


def run_alone(out, env: dict, **knobs) -> dict:
    """`python -m feedbench run` of TINY_MLP with `knobs` in `env`: its result, checked against the
    schema."""
    done = run_cell_process(out, {**TINY_MLP, **knobs}, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    jsonschema.validate(result, schema())
    return result


def test_one_process_without_the_knob_runs_with_pytorchs_default(tmp_path):
    env = plain_env()
    result = run_alone(tmp_path / "cell", env)
    assert result["cell"]["torch_threads"] is None
    assert result["torch_threads"] == pytorch_default(env) == result["launch_threads"]
    assert result["torch_threads_source"] == "pytorch default"


def test_omp_num_threads_of_the_environment_gives_one_thread(tmp_path):
    result = run_alone(tmp_path / "cell", plain_env(OMP_NUM_THREADS="1"))
    assert result["torch_threads"] == 1 and result["torch_threads_source"] == "OMP_NUM_THREADS"


def test_the_knob_overrides_the_environment(tmp_path):
    result = run_alone(tmp_path / "cell", plain_env(OMP_NUM_THREADS="1"), torch_threads=3)
    assert result["torch_threads"] == 3 and result["torch_threads_source"] == "knob"
    assert result["launch_threads"] == 1, (
        "what `python train.py` gets under that launch: the report's note"
    )


def test_two_ddp_ranks_run_with_one_thread_each_as_torchrun_gives_them(tmp_path):
    result = run_alone(
        tmp_path / "cell",
        plain_env(),
        parallel="ddp",
        gpus_per_node=2,
        comm_probe_steps=0,
        monitor_interval_s=5,
    )
    assert result["metrics"]["world_size"] == 2
    assert result["torch_threads"] == 1 and result["torch_threads_source"] == "torchrun ranks"
    assert [rank["torch_threads"] for rank in result["metrics"]["ranks"]] == [1, 1]


def test_a_cell_without_the_knob_gets_the_launchs_threads_back_after_one_with_it(run_cell):
    """In one process (the tests' run_cell): a knob's threads do not leak into the next cell."""
    from feedbench.harness.runner import LAUNCH_THREADS

    other = LAUNCH_THREADS + 1
    assert run_cell(**TINY_MLP, torch_threads=other)[1]["torch_threads"] == other
    code, result = run_cell(**TINY_MLP, torch_threads=None)
    assert code == 0 and result["torch_threads"] == LAUNCH_THREADS


def job(tmp_path, env: dict, *launch: str) -> dict:
    """The bench job (`python -m feedbench job`, the bench rule's command) of TINY_MLP in `env`,
    with --launch-env."""
    out = tmp_path / "job"
    cell = json.dumps({**TINY_MLP, "monitor_interval_s": 5})
    command = [sys.executable, "-m", "feedbench", "job", str(out), "--cell", cell, "--runtime", "5"]
    command += ["--log", str(tmp_path / "job.log"), "--launch-env", *launch]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "result.json").read_text())


def test_the_bench_job_gives_the_harness_the_workflows_threads_not_snakemakes(tmp_path):
    """Snakemake sets the six thread variables of every job to its threads (here 7); the job puts
    back the workflow's: none, so PyTorch's default; or the OMP_NUM_THREADS it was launched with."""
    as_snakemake = plain_env(**{name: "7" for name in threads.SNAKEMAKE_SETS})
    result = job(tmp_path / "none", as_snakemake)
    assert (
        result["torch_threads"] == pytorch_default(plain_env())
        and result["torch_threads_source"] == "pytorch default"
    )
    result = job(tmp_path / "one", as_snakemake, "OMP_NUM_THREADS=1")
    assert result["torch_threads"] == 1 and result["torch_threads_source"] == "OMP_NUM_THREADS"


def test_a_bad_launch_env_is_one_line_naming_what_is_allowed(tmp_path):
    cell = json.dumps(TINY_MLP)
    command = [
        sys.executable,
        "-m",
        "feedbench",
        "job",
        str(tmp_path),
        "--cell",
        cell,
        "--runtime",
        "5",
    ]
    command += ["--log", str(tmp_path / "log"), "--launch-env", "PATH=/bin"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and not (tmp_path / "result.json").exists()
    assert done.stderr.strip().splitlines() == [
        "feedbench: error: job: --launch-env 'PATH=/bin' is not NAME=VALUE of a variable "
        "Snakemake sets; allowed names: " + ", ".join(threads.SNAKEMAKE_SETS)
    ]


def test_the_source_names_what_pytorch_reads():
    assert threads.source(2, {"OMP_NUM_THREADS": "4"}) == "knob"
    assert threads.source(None, {"OMP_NUM_THREADS": "4"}) == "OMP_NUM_THREADS"
    # read last
    assert (
        threads.source(None, {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "2"}) == "MKL_NUM_THREADS"
    )
    assert threads.source(None, {"OMP_NUM_THREADS": "x"}) == "pytorch default"  # PyTorch ignores it
    assert threads.source(None, threads.torchrun_env({}, ranks_per_node=2)) == "torchrun ranks"
    assert threads.source(None, {}) == "pytorch default"


@pytest.mark.parametrize(
    ("env", "ranks_per_node", "omp"),
    [({}, 2, "1"), ({}, 1, None), ({"OMP_NUM_THREADS": "3"}, 4, "3")],
)
def test_torchruns_rule(env, ranks_per_node, omp):
    """torchrun sets OMP_NUM_THREADS=1 only with more than one rank a node and none set
    (torch.distributed.run)."""
    assert threads.torchrun_env(env, ranks_per_node).get("OMP_NUM_THREADS") == omp


def test_the_workflows_thread_variables_go_to_the_job_and_come_back():
    launched = {"OMP_NUM_THREADS": "4", "PATH": "/bin"}
    args = threads.launch_args(launched)
    assert args == ["OMP_NUM_THREADS=4"]
    job_env = {**launched, **{name: "7" for name in threads.SNAKEMAKE_SETS}}
    assert threads.restored(job_env, args) == launched


def test_the_result_schema_names_every_source():
    assert schema()["properties"]["torch_threads_source"]["enum"] == list(threads.SOURCES)


def test_the_report_says_where_the_knob_changed_the_trainers_threads_with_both_figures():
    """#33: a cell whose knob gave the trainer other threads than the launch gives `python train.py`
    is named, and where the experiment measured the same cell both ways, both figures are given."""
    import pandas as pd
    from feedbench.analysis.threads import note

    def row(cell, workers, used, rate):
        return dict(
            experiment="e",
            cell=cell,
            status="ok",
            num_workers=workers,
            torch_threads=used if used == 1 else None,
            torch_threads_used=used,
            torch_threads_launch=2,
            samples_per_s=rate,
        )

    rows = pd.DataFrame(
        [row("w0-t1", 0, 1, 1182.0), row("w0", 0, 2, 1566.0), row("w2-t1", 2, 1, 1211.0)]
    )
    text = note(rows)
    assert text.startswith(
        "2 of 3 cells ran the trainer with 1 intra-op thread(s) (knob torch_threads) where this "
        "launch gives an unmodified script 2"
    )
    assert (
        "Measured both (samples/s, medians): num_workers=0: 1 threads 1,182, 2 threads "
        "(the launch's) 1,566." in text
    )
    assert note(rows[rows["torch_threads_used"] == 2]) is None
