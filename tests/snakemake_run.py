"""Real Snakemake on the workflow from a test: the one command line every test that runs the workflow builds."""

from __future__ import annotations

import os
import subprocess
import sys


def snakemake_command(workflow: str, workdir, *args: str, cores: int = 2) -> list[str]:
    """`python -m snakemake` on `workflow`/Snakefile (the checkout or a copy of it), run in `workdir`."""
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


def snakemake_env() -> dict[str, str]:
    """This environment with the test's python first on PATH: the jobs' `python -m feedbench` is this one."""
    return dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])


def run_snakemake(workflow: str, workdir, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run it to the end, output captured."""
    command = snakemake_command(workflow, workdir, *args)
    return subprocess.run(command, capture_output=True, text=True, env=snakemake_env(), timeout=timeout)
