"""A real Slurm cluster on localhost for the tests: the session fixture `slurm_cluster`.

It installs Debian's Slurm, munge and MariaDB (tests/slurm/install.sh), brings
up munged, MariaDB, slurmdbd, slurmctld and two slurmd nodes with two fake GPUs
each (tests/slurm/cluster.sh up), and always tears them down at the end of the
session. A test module gets it with `pytest_plugins = ["helpers.slurm_cluster"]`
(a plugin, so that every module shares one cluster per session).

Under pytest-xdist every worker is a session of its own: conftest.py puts every
test marked `slurm` in one xdist group, so one worker starts the cluster, and
a lock held while it runs (HOST_LOCK) makes any other session on this host
wait for it to be torn down instead of starting a second one beside it.

Where the cluster cannot come up (not root, no apt, a daemon that fails) the
tests are skipped with a message saying how to enable them, except in CI
(CI=true), where that is a failure: CI must run them.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent.parent / "slurm"
INSTALL = HERE / "install.sh"
CLUSTER = HERE / "cluster.sh"
PARTITION = "debug"  # as in cluster.sh
GPU_PARTITION = "gpu"  # as in cluster.sh: the same nodes, not the default
ACCOUNT = "feedbench"  # an account cluster.sh creates, with root in it

# Held by the session whose cluster runs (released when it is torn down, or when that process dies).
# Not the lock file of the docs' `flock /tmp/feedbench-slurm.lock pytest ...`: that one is held by
# flock(1) around this process.
HOST_LOCK = Path("/tmp/feedbench-slurm-cluster.lock")
HOST_LOCK_WAIT_S = 1800

ENABLE = (
    "run the tests as root (the Slurm daemons run as root and munge): `bash "
    "tests/slurm/install.sh` installs Debian's packages, the fixture starts the daemons"
)
# States in which a job is still going somewhere; anything else is final.
ACTIVE = {
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "RESIZING",
    "SUSPENDED",
    "COMPLETING",
    "CONFIGURING",
    "SIGNALING",
    "STAGE_OUT",
}


@dataclass
class SlurmCluster:
    """The running test cluster: `env` is what client commands and Snakemake need (SLURM_CONF)."""

    state_dir: Path
    env: dict[str, str]
    partition: str = PARTITION
    account: str = ACCOUNT

    def run(
        self, *args: str, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess:
        """A Slurm client command (sbatch, sacct, ...) against this cluster."""
        proc = subprocess.run(
            list(args), env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
            )
        return proc

    def sbatch(self, script: Path, *options: str) -> str:
        """Submit a batch script; returns the job id."""
        out = self.run(
            "sbatch", "--parsable", f"--partition={self.partition}", *options, str(script)
        ).stdout
        return out.strip().split(";")[0]

    def jobs(self, job_ids, fields: str) -> dict[str, dict[str, str]]:
        """sacct's rows of the allocations of these jobs, by job id."""
        names = ["JobIDRaw", *fields.split(",")]
        out = self.run(
            "sacct", "-n", "-P", "-X", "-j", ",".join(job_ids), "-o", ",".join(names)
        ).stdout
        rows = [dict(zip(names, line.split("|"), strict=True)) for line in out.splitlines() if line]
        return {row["JobIDRaw"]: row for row in rows}

    def sacct(
        self,
        job_id: str,
        fields: str = "JobID,State,ExitCode,NodeList,AllocTRES",
        steps: bool = False,
    ) -> list[dict[str, str]]:
        """sacct's rows for a job (the allocation only, unless steps), as dicts."""
        names = fields.split(",")
        args = ["sacct", "-n", "-P", "-j", job_id, "-o", fields] + ([] if steps else ["-X"])
        lines = self.run(*args).stdout.splitlines()
        return [dict(zip(names, line.split("|"), strict=True)) for line in lines if line]

    def wait(self, job_id: str, timeout: float = 120) -> dict[str, str]:
        """Poll sacct until the job reaches a final state; returns its row."""
        # "CANCELLED by 0"
        return self.wait_sacct(job_id, lambda row: row["State"].split()[0] not in ACTIVE, timeout)

    def wait_sacct(self, job_id: str, done, timeout: float = 120) -> dict[str, str]:
        """Poll sacct until done(row of the job) is true; returns the row."""
        deadline = time.monotonic() + timeout
        while True:
            rows = self.sacct(job_id)
            if rows and done(rows[0]):
                return rows[0]
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"job {job_id}: sacct still says {rows} after {timeout:.0f}s; logs in "
                    f"{self.state_dir / 'log'}"
                )
            time.sleep(1)


# The plugin's line for each job it submits; its log folder is the job's wildcards joined by _
# (rule_bench/E_C_R/, or rule_bench_target/ for the cells measured on the target's GPU).
SUBMITTED = re.compile(
    r"has been submitted with SLURM jobid (\d+) \(log: "
    r".*/rule_bench(?:_target)?/([^/]+)/\d+\.log\)"
)


def submitted_bench_jobs(snakemake_output: str) -> dict[str, str]:
    """experiment_cell_repeat -> Slurm job id of each bench job a run submitted, from its output.
    Not from the job comment: sacct returns comments only with AccountingStoreFlags=job_comment,
    which the test cluster leaves unset, as most sites do."""
    return {cell: job for job, cell in SUBMITTED.findall(snakemake_output)}


def _unavailable(reason: str, hint: str = f"To enable: {ENABLE}") -> None:
    """Skip with how to enable, or fail in CI where the Slurm tests must run."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Slurm test cluster unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"Slurm test cluster unavailable: {reason}\n{hint}")


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _claim_host():
    """The host's one test cluster: wait (bounded) while another session's runs; returns the open,
    locked file."""
    lock = open(HOST_LOCK, "a")
    deadline = time.monotonic() + HOST_LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return lock
        except BlockingIOError:
            if time.monotonic() > deadline:
                lock.close()
                _unavailable(
                    f"another test session's cluster still holds {HOST_LOCK} after "
                    f"{HOST_LOCK_WAIT_S} s"
                )
            time.sleep(2)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    if os.geteuid() != 0:
        _unavailable("not root")
    install = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=900)
    if install.returncode != 0:
        _unavailable(f"tests/slurm/install.sh failed:\n{_tail(install.stdout + install.stderr)}")
    missing = [
        cmd
        for cmd in ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd", "sbatch")
        if shutil.which(cmd) is None
    ]
    if missing:
        _unavailable(f"{', '.join(missing)} not installed ({install.stdout.strip()})")

    host = _claim_host()
    state_dir = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "SLURM_CONF": str(state_dir / "etc" / "slurm.conf")}
    try:
        try:
            up = subprocess.run(
                ["bash", str(CLUSTER), "up", str(state_dir)],
                capture_output=True,
                text=True,
                timeout=180,
            )
        except subprocess.TimeoutExpired as e:
            _unavailable(
                f"cluster.sh up still running after {e.timeout}s", f"Logs: {state_dir / 'log'}"
            )
        if up.returncode != 0:
            _unavailable(
                f"cluster.sh up failed:\n{_tail(up.stdout + up.stderr)}",
                f"Logs: {state_dir / 'log'}",
            )
        yield SlurmCluster(state_dir=state_dir, env=env)
    finally:
        # Always, even after a failed or interrupted `up`: it stops what started.
        down = subprocess.run(
            ["bash", str(CLUSTER), "down", str(state_dir)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if down.returncode == 0:
            # ~100 MB of database; the logs stay
            shutil.rmtree(state_dir / "mysql", ignore_errors=True)
        else:
            print(f"cluster.sh down failed:\n{down.stdout}{down.stderr}")
        host.close()  # releases the lock
