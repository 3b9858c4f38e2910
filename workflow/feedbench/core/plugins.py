"""The user's own code, plugged in by import path: `package.module:attribute`.

Importing user code runs it. Targets come only from the config the user wrote
(the knobs that take it: feedbench.core.knobs.user_code), never from results. The
folders of the config's `python_path` go on sys.path first; their content is
fingerprinted, so a change to the user's code reruns the cells that use it.
Torch-free at import: the Snakefile resolves every target before any job.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import inspect
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from .knobs import KnobError, user_code_of
from .planned_cell import ARG_KNOBS


def plugins_of(cell) -> dict[str, str]:
    """knob -> import path, for the knobs of the cell (a feedbench.core.cell.Cell) that name user
    code."""
    return user_code_of(vars(cell))


def add_paths(paths: list[str]) -> None:
    """Put the user's folders first on sys.path (each once)."""
    for path in reversed(paths):
        if path not in sys.path:
            sys.path.insert(0, path)


def did_you_mean(name: str, names) -> str:
    """` (did you mean 'x'?)` for the closest of `names` to a misspelled `name`, else ''."""
    close = difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def load(target: str, knob: str) -> Any:
    """The object `package.module:attribute` names, or KnobError `knob '<knob>': cannot import
    '<target>' (...)`; a misspelled attribute gets the closest name its module or class has."""
    module_name, _, attribute = target.partition(":")
    try:
        obj = importlib.import_module(module_name)
        for part in attribute.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError as error:
                public = [name for name in dir(obj) if not name.startswith("_")]
                raise AttributeError(f"{error}{did_you_mean(part, public)}") from None
    # an import runs the user's module: any error it raises means the same
    except Exception as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise KnobError(
            f"knob '{knob}': cannot import '{target}' ({type(error).__name__}: {reason})"
        ) from None
    if not callable(obj):
        raise KnobError(
            f"knob '{knob}': '{target}' is a {type(obj).__name__}, not callable; allowed: a "
            "function or class"
        )
    return obj


def resolve_all(cell) -> dict[str, Any]:
    """Import every target of the cell (after its python_path): knob -> callable, each factory's
    arguments checked against its signature (check_args). Done before any job and in each."""
    add_paths(cell.python_path)
    loaded = {knob: load(target, knob) for knob, target in plugins_of(cell).items()}
    # made stages in each process: checked here first
    for target in getattr(cell, "stage_functions", None) or []:
        load(target, "stage_functions")
    for args_knob in ARG_KNOBS:
        knob = args_knob.removesuffix("_args")
        if knob == "loss" and knob in loaded:
            check_loss_args(loaded[knob], getattr(cell, args_knob), getattr(cell, knob))
        # an optimizer's first argument is the parameters, as a factory's may be ctx
        elif knob in loaded:
            first = True if knob == "optimizer" else None
            check_args(
                loaded[knob], getattr(cell, args_knob), getattr(cell, knob), args_knob, first
            )
    return loaded


def check_loss_args(loss: Any, args: dict, target: str) -> None:
    """loss_args against the user's loss: a class's constructor takes them (it is built as
    cls(**loss_args), then called as f(output, target)); a function, called as f(output, target)
    itself, takes none."""
    if inspect.isclass(loss):
        check_args(loss, args, target, "loss_args", first_taken=False)
    elif args:
        raise KnobError(
            f"knob 'loss_args': '{target}' is a function, called as f(output, target) with no "
            "loss_args; allowed: {}, or a loss class (built as cls(**loss_args))"
        )


def _parameters(factory: Any) -> list[inspect.Parameter] | None:
    """The factory's parameters (a class's __init__'s, less self); None where Python cannot read its
    signature."""
    try:
        return list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return None


def takes_ctx(factory: Any) -> bool:
    """Whether a dataset or model factory is called with the cell's Context first: its first
    positional parameter is named `ctx` (or annotated Context). The user's own class or function
    without one (`MyDataset(root, max_len)`) is called with its arguments alone, so it is named as
    it is, with no adapter. A signature Python cannot read: ctx first, as before."""
    parameters = _parameters(factory)
    if parameters is None:
        return True
    first = next(
        (p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)), None
    )
    return first is not None and (first.name == "ctx" or first.annotation in (Context, "Context"))


def call_factory(factory: Any, ctx: Any, args: dict) -> Any:
    """factory(ctx, **args) or factory(**args), as its signature says (takes_ctx)."""
    return factory(ctx, **args) if takes_ctx(factory) else factory(**args)


def check_args(
    factory: Any, args: dict, target: str, args_knob: str, first_taken: bool | None = None
) -> None:
    """The keys of `args` (dataset_args, model_args) against the signature of the factory they go to
    (call_factory): a key it does not take, or an argument it needs and does not get, is one
    KnobError before any job, where it would be a TypeError in every cell. A factory whose signature
    Python cannot read, or that takes **kwargs, is not checked. `first_taken`: whether the call
    fills the first positional parameter itself (None: takes_ctx)."""
    parameters = _parameters(factory)
    if parameters is None or any(p.kind is p.VAR_KEYWORD for p in parameters):
        return
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    first_taken = takes_ctx(factory) if first_taken is None else first_taken
    ctx = positional[0] if positional and first_taken else None
    named = [
        p
        for p in parameters
        if p is not ctx and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    names = [p.name for p in named]
    for key in args:
        if key not in names:
            allowed = ", ".join(names) or "none"
            raise KnobError(
                f"knob '{args_knob}': key '{key}' is not an argument of '{target}'"
                f"{did_you_mean(key, names)}; allowed: {allowed}"
            )
    missing = [p.name for p in named if p.default is p.empty and p.name not in args]
    if missing:
        raise KnobError(
            f"knob '{args_knob}': '{target}' needs {', '.join(repr(m) for m in missing)}; "
            f"allowed: add {'them' if len(missing) > 1 else 'it'} to {args_knob}"
        )


def expect(value: Any, kinds: tuple[type, ...], what: str, target: str, knob: str) -> Any:
    """The value a factory returned when it is one of `kinds`, else KnobError saying what came
    back."""
    if not isinstance(value, kinds):
        raise KnobError(
            f"knob '{knob}': '{target}' returned {type(value).__module__}."
            f"{type(value).__qualname__}; allowed: {what}"
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
    """One python_path folder for provenance: the path, its git commit (None outside a checkout),
    its content hash."""
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
    """sha256 over the Python files (names and bytes) under the folders: changes when the user's
    code does."""
    digest = hashlib.sha256()
    for root in paths:
        for folder, subfolders, names in sorted(os.walk(root)):
            subfolders[:] = sorted(
                d for d in subfolders if not d.startswith(".") and d != "__pycache__"
            )
            for name in sorted(n for n in names if n.endswith(".py")):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as f:
                    digest.update(f.read() + b"\0")
    return digest.hexdigest()[:16]
