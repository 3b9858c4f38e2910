"""Real Snakemake on the workflow from a test: the copy of the workflow it runs, and the one command
line every test that runs the workflow builds."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import ROOT

# What a copy of the workflow holds: the Snakefile, its rules, scripts and schema, the feedbench
# package, the profiles.
COPIED = ["Snakefile", "config", "profiles", "envs", "report", "workflow"]


def snakemake_command(workflow: str, workdir, *args: str, cores: int = 2) -> list[str]:
    """`python -m snakemake` on `workflow`/Snakefile (the checkout or a copy of it), run in
    `workdir`."""
    snakefile = os.path.join(workflow, "Snakefile")
    return [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        snakefile,
        "--directory",
        str(workdir),
        "--cores",
        str(cores),
        *args,
    ]


def snakemake_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (this environment) with the test's venv taken off PATH, as a user who types
    `.venv/bin/snakemake` without activating it has: the jobs must run the workflow's own Python
    (feedbench.plan.job.job_python), not the first `python` on PATH, which may lack torch."""
    base = dict(os.environ if base is None else base)
    # not realpath: the venv's python links out of it
    venv_bin = os.path.dirname(os.path.abspath(sys.executable))
    keep = [
        p for p in base.get("PATH", "").split(os.pathsep) if p and os.path.abspath(p) != venv_bin
    ]
    return dict(base, PATH=os.pathsep.join(keep))


def run_snakemake(
    workflow: str, workdir, *args: str, timeout: int = 600
) -> subprocess.CompletedProcess:
    """Run it to the end, output captured."""
    command = snakemake_command(workflow, workdir, *args)
    return subprocess.run(
        command, capture_output=True, text=True, env=snakemake_env(), timeout=timeout
    )


def copy_workflow(dest, source: str = ROOT) -> str:
    """The workflow copied into `dest` (a folder that exists): a test's edits and runs leave the
    checkout alone."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".snakemake", "results", "logs")
    for name in COPIED:
        src = os.path.join(source, name)
        (shutil.copytree if os.path.isdir(src) else shutil.copy2)(
            src, os.path.join(dest, name), **({"ignore": ignore} if os.path.isdir(src) else {})
        )
    return str(dest)


def snakemake(workflow: str, workdir, config: dict, *args: str) -> subprocess.CompletedProcess:
    """`snakemake` on the copy, in workdir, with `config` as the only configfile."""
    path = os.path.join(workdir, "config.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    # --configfile last: it takes every word up to the next option, so targets in args must come
    # before it.
    return run_snakemake(workflow, workdir, *args, "--configfile", path)


def workflow_copy(tmp_path: Path) -> tuple[str, Path]:
    """A copy of the workflow in tmp_path/workflow and an empty working directory, tmp_path/run."""
    (tmp_path / "workflow").mkdir()
    (tmp_path / "run").mkdir()
    return copy_workflow(tmp_path / "workflow"), tmp_path / "run"


def planned(workflow: str, workdir, config: dict) -> set[str]:
    """The cells (experiment/cell/rep<k>) a dry run would measure."""
    run = snakemake(workflow, workdir, config, "--dry-run")
    assert run.returncode == 0, run.stderr + run.stdout
    return set(re.findall(r"output: results/cells/(\S+)/result\.json", run.stdout))
