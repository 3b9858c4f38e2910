"""Parsing the Snakefile imports no torch, and feedbench's part of it no pandas: every parse (the
run's and each job's) would pay seconds for them."""

from __future__ import annotations

import subprocess
import sys

import yaml
from conftest import ROOT
from feedbench.core.model_names import TORCHVISION_MODELS
from helpers.snakemake_run import snakemake_command

HEAVY = ("torch", "torchvision")
# Heavy for a parse, though Snakemake may import them itself (its Slurm plugin imports pandas):
# feedbench must not.
ANALYSIS = ("pandas", "matplotlib")


def modules_imported(stderr: str) -> set[str]:
    """Modules a `python -X importtime` run imported (its stderr)."""
    lines = [
        line for line in stderr.splitlines() if line.startswith("import time:") and "|" in line
    ]
    return {line.rsplit("|", 1)[1].strip() for line in lines[1:]}


def imported(stderr: str) -> set[str]:
    """Top-level packages a `python -X importtime` run imported (its stderr)."""
    return {module.split(".")[0] for module in modules_imported(stderr)}


def test_snakefile_parses_without_torch(tmp_path):
    """A dry run checks every cell (a torchvision model among them) and its plot, and plans every
    job, importing no torch; the feedbench modules it imported bring in no pandas or matplotlib on
    their own."""
    config = {
        "defaults": {"repeats": 1, "steps": 2, "device": "cpu"},
        "experiments": {
            "tiny": {
                "base": {"scenario": "train", "image_size": 32},
                "matrix": {"model": ["mlp", "resnet18"]},
                "plot": {"x": "model", "y": "stall_pct"},  # a summary column, checked at parse
            }
        },
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    run = subprocess.run(
        # python -X importtime -m snakemake ...: the trace of every module the parse imports, on
        # stderr.
        [sys.executable, "-X", "importtime"]
        + snakemake_command(
            ROOT, tmp_path, "--configfile", str(tmp_path / "config.yaml"), "--dry-run", cores=1
        )[1:],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "bench" in run.stdout  # the cells were planned, so every one of them was checked
    modules = imported(run.stderr)
    assert "snakemake" in modules and "feedbench" in modules  # the parse itself is in the trace
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))
    # Snakemake may have imported pandas before feedbench asked for it: import feedbench's modules
    # of the parse alone.
    ours = sorted(m for m in modules_imported(run.stderr) if m.split(".")[0] == "feedbench")
    assert "feedbench.plan.matrix" in ours
    code = (
        f"import sys, {', '.join(ours)}; print(sorted(m for m in {ANALYSIS + HEAVY} if m "
        "in sys.modules))"
    )
    alone = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert alone.stdout.strip() == "[]", (ours, alone.stdout)


def test_a_bad_model_name_is_one_line_before_any_job(tmp_path):
    config = {"experiments": {"tiny": {"base": {"model": "resnet19"}}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    run = subprocess.run(
        snakemake_command(
            ROOT, tmp_path, "--configfile", str(tmp_path / "config.yaml"), "--dry-run", cores=1
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode != 0
    assert (
        "bad config: experiments.tiny.base.model: value 'resnet19' is not known; allowed: none, mlp"
        in run.stdout + run.stderr
    )
    # one line, with no Snakemake frame around it that reads like a crash (#49)
    said = run.stdout + run.stderr
    assert "WorkflowError" not in said and "common.smk" not in said and 'File "' not in said, said
    assert [line for line in run.stderr.splitlines() if "bad config" in line] == [
        run.stderr.strip().splitlines()[-1]
    ]


def test_the_cached_model_list_is_the_installed_torchvisions():
    """core.model_names keeps torchvision's list so that the parse needs no torchvision: it must not
    go stale."""
    import torchvision

    installed = tuple(torchvision.models.list_models(module=torchvision.models))
    assert TORCHVISION_MODELS == installed, (
        f"torchvision {torchvision.__version__} has other classification models: update "
        "workflow/feedbench/core/model_names.py (added: "
        f"{sorted(set(installed) - set(TORCHVISION_MODELS))}, gone: "
        f"{sorted(set(TORCHVISION_MODELS) - set(installed))})"
    )
