"""`snakemake --profile slurm` as Snakemake users type it: `make setup` links the checkout's
profiles/slurm into Snakemake's profile folder (profiles/link.sh), never over a profile of the
user's own."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import ROOT
from feedbench.plan.job import job_python
from helpers.snakemake_run import copy_workflow, snakemake_env
from snakemake_interface_executor_plugins.settings import DeploymentMethod


def link(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", os.path.join(ROOT, "profiles", "link.sh"), sys.executable],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def test_the_slurm_profile_is_found_by_name_after_the_set_up(tmp_path):
    """A fresh checkout (a copy of this one) after its set-up's link: `snakemake --profile slurm
    -n`, typed in it, plans the default matrix through the checkout's profiles/slurm."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    copy_workflow(checkout)
    env = snakemake_env(dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "config")))
    first = subprocess.run(
        ["bash", str(checkout / "profiles" / "link.sh"), sys.executable],
        env=env,
        capture_output=True,
        text=True,
    )
    assert first.returncode == 0, first.stderr
    dest = tmp_path / "config" / "snakemake" / "slurm"
    assert os.path.realpath(dest) == str(checkout / "profiles" / "slurm"), first.stdout
    assert first.stdout.count("\n") == 1 and "linked" in first.stdout
    again = subprocess.run(
        ["bash", str(checkout / "profiles" / "link.sh"), sys.executable],
        env=env,
        capture_output=True,
        text=True,
    )
    # linked already: nothing to say
    assert again.returncode == 0 and again.stdout == "", again.stdout
    run = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "slurm", "-n"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert "Using profiles slurm and workflow specific profile profiles/default" in out, out[-3000:]
    stats = dict(re.findall(r"^(\w+)\s+(\d+)$", out.split("Job stats:")[-1], re.M))
    assert int(stats["bench"]) > 0 and stats["total"] == "66", stats  # the default matrix


def test_a_users_own_slurm_profile_is_left_alone_and_named(tmp_path):
    mine = tmp_path / "config" / "snakemake" / "slurm"
    mine.mkdir(parents=True)
    (mine / "config.yaml").write_text("executor: slurm\n")
    run = link(dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "config")))
    assert run.stdout.splitlines() == [
        f"profiles: snakemake --profile slurm uses {mine} (yours, left alone); this checkout's: "
        f"--profile {os.path.join(ROOT, 'profiles', 'slurm')}"
    ]
    assert not mine.is_symlink() and (mine / "config.yaml").read_text() == "executor: slurm\n"


def test_a_link_to_a_deleted_checkout_is_replaced(tmp_path):
    folder = tmp_path / "config" / "snakemake"
    folder.mkdir(parents=True)
    (folder / "slurm").symlink_to(tmp_path / "gone" / "profiles" / "slurm")
    run = link(dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "config")))
    assert "linked" in run.stdout
    assert os.path.realpath(folder / "slurm") == os.path.join(ROOT, "profiles", "slurm")


def test_jobs_run_the_workflows_python_or_the_rules_environments():
    assert job_python(set()) == sys.executable
    assert job_python({DeploymentMethod.ENV_MODULES}) == sys.executable
    assert job_python({DeploymentMethod.CONDA}) == "python"
    assert job_python({DeploymentMethod.APPTAINER, DeploymentMethod.CONDA}) == "python"
