"""The trainer's intra-op threads: those the user's own launch would give it, unless the knob
`torch_threads` says.

A measuring tool must measure the job the user runs: on a CPU the trainer's threads decide whether
loader workers help (2 workers sped up a trainer of 1 thread on 2 cores by 30 % and slowed one of 2
threads by 21 %).

    single process  `python train.py` (most single-GPU jobs, every Lightning `devices=1` job) gets
                    PyTorch's default, one thread per core, or OMP_NUM_THREADS where its environment
                    sets it (MKL_NUM_THREADS, which PyTorch reads after it, wins where both are set)
    several ranks   torchrun sets OMP_NUM_THREADS=1 for each rank when it starts more than one per
                    node and the environment sets none; srun sets nothing, so the launcher applies
                    torchrun's rule there too
    the knob        `torch_threads` overrides both

Snakemake sets OMP_NUM_THREADS, MKL_NUM_THREADS and four others of every job to the job's threads:
the workflow hands the job the values the user launched it with (--launch-env), and the job puts
those back for the harness. Plain Python: the Snakefile's parse and the job use it without torch.
"""

from __future__ import annotations

from collections.abc import Mapping

# What PyTorch's default reads, in its order: the last one set wins.
ENVIRONMENT = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# Every variable Snakemake's shell sets to a job's threads (snakemake/shell.py).
SNAKEMAKE_SETS = (
    "OMP_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
# Set by the launcher beside OMP_NUM_THREADS=1 when it applies torchrun's rule, so a rank can say
# why it has 1 thread.
TORCHRUN_MARK = "FEEDBENCH_TORCHRUN_THREADS"
# Why the trainer ran with its threads: the result's `torch_threads_source`.
SOURCES = ("knob", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "torchrun ranks", "pytorch default")


def env_threads(env: Mapping[str, str], name: str) -> int | None:
    """The threads environment variable `name` asks for; None when unset or not a positive integer
    (PyTorch then ignores it)."""
    value = env.get(name, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def source(knob: int | None, env: Mapping[str, str]) -> str:
    """Why this process's trainer runs with the threads it does (one of SOURCES)."""
    if knob:
        return "knob"
    if env.get(TORCHRUN_MARK):
        return "torchrun ranks"
    for name in reversed(ENVIRONMENT):  # the last PyTorch reads wins
        if env_threads(env, name) is not None:
            return name
    return "pytorch default"


def torchrun_env(env: Mapping[str, str], ranks_per_node: int) -> dict:
    """The ranks' environment under torchrun's rule: OMP_NUM_THREADS=1 (and the mark) when more than
    one rank runs on a node and `env` sets no OMP_NUM_THREADS; `env` unchanged otherwise."""
    if ranks_per_node > 1 and "OMP_NUM_THREADS" not in env:
        return {**env, "OMP_NUM_THREADS": "1", TORCHRUN_MARK: "1"}
    return dict(env)


def launch_args(env: Mapping[str, str]) -> list[str]:
    """The job's --launch-env values: NAME=VALUE for each of SNAKEMAKE_SETS the workflow's own
    environment sets."""
    return [f"{name}={env[name]}" for name in SNAKEMAKE_SETS if name in env]


def restored(env: Mapping[str, str], launch: list[str]) -> dict:
    """`env` with SNAKEMAKE_SETS as the workflow was launched with them: each removed, then
    `launch`'s NAME=VALUE set.

    ValueError in one line for an entry that is not NAME=VALUE of one of SNAKEMAKE_SETS."""
    out = {name: value for name, value in env.items() if name not in SNAKEMAKE_SETS}
    for entry in launch:
        name, equals, value = entry.partition("=")
        if not equals or name not in SNAKEMAKE_SETS:
            raise ValueError(
                f"--launch-env {entry!r} is not NAME=VALUE of a variable Snakemake sets; allowed "
                "names: " + ", ".join(SNAKEMAKE_SETS)
            )
        out[name] = value
    return out
