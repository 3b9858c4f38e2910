"""A command cell's command (knob `command`): the user's own training script, run as it is.

Its arguments as a shell splits them, the script or module it runs, the checks the plan makes
before any job (the script exists, the interpreter runs), and the fingerprint that reruns its cells
when the script changes. The harness runs it (harness.command) and measures it from inside
(harness.inloop). Plain Python: the Snakefile plans with it.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
from typing import Any

from .knobs import KNOBS, KnobError, shown

# The scenarios a command runs: its loop (train), its training loader drained alone (loader), its
# loop on batches replayed from memory (compute). A transfer probe has no command to run.
COMMAND_SCENARIOS = ("train", "loader", "compute")
# How a command's ranks are started: one process, or torchrun's (the script sets up DDP itself).
COMMAND_PARALLEL = ("none", "ddp")


def argv(command: str) -> list[str]:
    """The command's arguments as a POSIX shell splits them (quotes kept together), after `python`;
    KnobError for an empty command or an unclosed quote."""
    try:
        args = shlex.split(command)
    except ValueError as error:
        raise KnobError(
            f"knob 'command': value {shown(command)} cannot be split ({error}); allowed: a "
            "script and its arguments as a shell takes them"
        ) from None
    if not args or args[0] in ("-c", "-"):
        raise KnobError(
            f"knob 'command': value {shown(command)} names no script; allowed: script.py "
            "[arguments] or -m package.module [arguments]"
        )
    if args[0] == "-m" and len(args) < 2:
        raise KnobError(
            f"knob 'command': value {shown(command)} names no module after -m; allowed: -m "
            "package.module [arguments]"
        )
    return args


def script_of(args: list[str]) -> str | None:
    """The script file a command runs (its first argument), or None for `-m module`."""
    return None if args[0].startswith("-") else args[0]


def check_knobs(values: dict[str, Any]) -> None:
    """What a cell's knobs alone show of a command (core.cell.parse_cell): a command that splits,
    run in a scenario and a parallel mode it has, and no knob its script decides."""
    if values["command"] is None:
        for name in ("python", "workdir"):
            if values[name] is not None:
                raise KnobError(
                    f"knob '{name}': value {shown(values[name])} is set without a command; "
                    "allowed: null, or a command (knob command)"
                )
        return
    argv(values["command"])
    if values["scenario"] not in COMMAND_SCENARIOS:
        raise KnobError(
            f"knob 'scenario': value {values['scenario']!r} is not allowed with a command; "
            f"allowed: {', '.join(COMMAND_SCENARIOS)}"
        )
    if values["parallel"] not in COMMAND_PARALLEL:
        raise KnobError(
            f"knob 'parallel': value {values['parallel']!r} is not allowed with a command (its "
            "script runs its own model); allowed: none, or ddp (its ranks started by torchrun)"
        )
    for name, knob in KNOBS.items():
        if knob.in_command is None and values[name] != knob.default:
            raise KnobError(
                f"knob '{name}': value {shown(values[name])} is not allowed with a command: its "
                "script decides it; allowed: the knobs of a command cell (docs/knobs.md: "
                "num_workers, pin_memory, ..., stage_timing, torch_threads)"
            )


def from_defaults_only(knobs: dict, sources: dict) -> tuple[dict, dict]:
    """A command cell's knobs less those its script decides that came from the config's `defaults`
    (set there for the other experiments); one set in the experiment itself stays, to be refused."""
    if not knobs.get("command"):
        return knobs, sources
    dropped = [
        name
        for name, value in knobs.items()
        if name in KNOBS
        and KNOBS[name].in_command is None
        and str(sources.get(name, "")).startswith("defaults")
    ]
    return (
        {k: v for k, v in knobs.items() if k not in dropped},
        {k: v for k, v in sources.items() if k not in dropped},
    )


def with_folder(knobs: dict, folder: str | None) -> dict:
    """workdir made absolute against the config file's folder (itself where unset), and a python
    given as a relative path likewise: the jobs run in Snakemake's --directory, wherever that is."""
    if not knobs.get("command") or folder is None:
        return knobs
    knobs = dict(knobs)
    knobs["workdir"] = os.path.normpath(os.path.join(folder, knobs.get("workdir") or "."))
    python = knobs.get("python")
    if python and os.sep in python and not os.path.isabs(python):
        knobs["python"] = os.path.normpath(os.path.join(folder, python))
    return knobs


def check_paths(knobs: dict) -> None:
    """The command's files, before any job: its workdir and script exist, its interpreter runs."""
    if not knobs.get("command"):
        return
    workdir = knobs.get("workdir") or os.getcwd()
    if not os.path.isdir(workdir):
        raise KnobError(
            f"knob 'workdir': folder {shown(workdir)} does not exist; allowed: an existing folder"
        )
    script = script_of(argv(knobs["command"]))
    if script is not None and not os.path.isfile(os.path.join(workdir, script)):
        raise KnobError(
            f"knob 'command': script {shown(script)} does not exist in {workdir}; allowed: a "
            "script in the config file's folder (or in workdir), or -m package.module"
        )
    python = knobs.get("python")
    if python and interpreter(python) is None:
        raise KnobError(
            f"knob 'python': {shown(python)} is no executable file nor a name on PATH; allowed: "
            "an interpreter's path, a name on PATH, or null (the workflow's own)"
        )


def interpreter(python: str) -> str | None:
    """The interpreter's path: a path as it is (if it runs), a bare name found on PATH."""
    if os.sep in python:
        return python if os.access(python, os.X_OK) and os.path.isfile(python) else None
    return shutil.which(python)


def fingerprint(knobs: dict) -> str | None:
    """sha256 of the command's script (its text) or module's file under workdir: in the cell's
    params, so a change to the script reruns its cells. None where neither is a file here."""
    if not knobs.get("command"):
        return None
    args, workdir = argv(knobs["command"]), knobs.get("workdir") or "."
    script = script_of(args)
    if script is None:
        base = os.path.join(workdir, *args[1].split("."))
        candidates = [base + ".py", os.path.join(base, "__main__.py")]
    else:
        candidates = [os.path.join(workdir, script)]
    path = next((c for c in candidates if os.path.isfile(c)), None)
    if path is None:
        return None
    digest = hashlib.sha256(knobs["command"].encode() + b"\0")
    with open(path, "rb") as f:
        digest.update(f.read())
    return digest.hexdigest()[:16]
