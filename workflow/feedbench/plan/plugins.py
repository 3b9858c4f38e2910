"""The user's own code, plugged in by import path: `package.module:attribute`.

Importing user code runs it. Targets come only from the config the user wrote
(the knobs that take it: feedbench.plan.knobs.user_code), never from results. The
folders of the config's `python_path` go on sys.path first; their content is
fingerprinted, so a change to the user's code reruns the cells that use it.
Torch-free at import: the Snakefile resolves every target before any job.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from .knobs import KnobError, user_code_of


def plugins_of(cell) -> dict[str, str]:
    """knob -> import path, for the knobs of the cell (a feedbench.plan.cell.Cell) that name user code."""
    return user_code_of(vars(cell))


def add_paths(paths: list[str]) -> None:
    """Put the user's folders first on sys.path (each once)."""
    for path in reversed(paths):
        if path not in sys.path:
            sys.path.insert(0, path)


def load(target: str, knob: str) -> Any:
    """The object `package.module:attribute` names, or KnobError `knob '<knob>': cannot import '<target>' (...)`."""
    module_name, _, attribute = target.partition(":")
    try:
        obj = importlib.import_module(module_name)
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except Exception as error:  # an import runs the user's module: any error it raises means the same
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise KnobError(f"knob '{knob}': cannot import '{target}' ({type(error).__name__}: {reason})") from None
    if not callable(obj):
        raise KnobError(
            f"knob '{knob}': '{target}' is a {type(obj).__name__}, not callable; allowed: a function or class"
        )
    return obj


def resolve_all(cell) -> dict[str, Any]:
    """Import every target of the cell (after its python_path): knob -> callable. Done before any job and in each."""
    add_paths(cell.python_path)
    return {knob: load(target, knob) for knob, target in plugins_of(cell).items()}


def expect(value: Any, kinds: tuple[type, ...], what: str, target: str, knob: str) -> Any:
    """The value a factory returned when it is one of `kinds`, else KnobError saying what came back."""
    if not isinstance(value, kinds):
        raise KnobError(
            f"knob '{knob}': '{target}' returned {type(value).__module__}.{type(value).__qualname__}; allowed: {what}"
        )
    return value


@dataclass
class Context:
    """What a factory and a step know of the cell they run in (docs/harness.md: "Your own code")."""

    rank: int
    world_size: int
    local_rank: int
    device: Any
    batch_size: int
    num_workers: int
    seed: int
    knobs: dict = field(default_factory=dict)
    optimizer: Any = None


def folder_facts(path: str) -> dict[str, Any]:
    """One python_path folder for provenance: the path, its git commit (None outside a checkout), its content hash."""
    try:
        commit = (
            subprocess.run(
                ["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"path": path, "git_commit": commit, "content": content_hash([path])}


def content_hash(paths: list[str]) -> str:
    """sha256 over the Python files (names and bytes) under the folders: changes when the user's code does."""
    digest = hashlib.sha256()
    for root in paths:
        for folder, subfolders, names in sorted(os.walk(root)):
            subfolders[:] = sorted(d for d in subfolders if not d.startswith(".") and d != "__pycache__")
            for name in sorted(n for n in names if n.endswith(".py")):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as f:
                    digest.update(f.read() + b"\0")
    return digest.hexdigest()[:16]
