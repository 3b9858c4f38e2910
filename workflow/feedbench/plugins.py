"""The user's own code, plugged in by import path: `package.module:attribute`.

Importing user code runs it. Targets come only from the config the user wrote
(knobs dataset, model, collate, to_device, step), never from results. The
folders of the config's `python_path` go on sys.path first; their content is
fingerprinted, so a change to the user's code reruns the cells that use it.
Torch-free at import: the Snakefile resolves every target before any job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from .knobs import KnobError, user_code_of


def plugins_of(cell) -> dict[str, str]:
    """knob -> import path, for the knobs of the cell (a feedbench.cell.Cell) that name user code."""
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


def batch_tensors(batch) -> list:
    """Every tensor of a batch: nested dicts, lists, tuples and dataclasses."""
    import torch

    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        return [t for v in batch.values() for t in batch_tensors(v)]
    if isinstance(batch, (list, tuple)):
        return [t for v in batch for t in batch_tensors(v)]
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return [t for f in dataclasses.fields(batch) for t in batch_tensors(getattr(batch, f.name))]
    return []


def move_batch(batch, device, non_blocking: bool):
    """Every tensor of a batch on the device: nested dicts, lists, tuples, namedtuples and dataclasses."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return type(batch)((k, move_batch(v, device, non_blocking)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move_batch(v, device, non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_batch(v, device, non_blocking) for v in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(
            batch,
            **{
                f.name: move_batch(getattr(batch, f.name), device, non_blocking)
                for f in dataclasses.fields(batch)
                if f.init
            },
        )
    return batch


def batch_len(batch) -> int:
    """Samples in a batch: the first dimension of its first tensor (0 when it holds none)."""
    tensors = batch_tensors(batch)
    return int(tensors[0].shape[0]) if tensors and tensors[0].dim() else 0


def unpinned_note(batch) -> str | None:
    """The adjustment when pin_memory was asked for and the first batch came back with unpinned tensors."""
    tensors = batch_tensors(batch)
    unpinned = sum(1 for t in tensors if not t.is_pinned())
    if not tensors or not unpinned:
        return None
    return (
        f"pin_memory=true but the first batch came back unpinned ({unpinned} of {len(tensors)} tensors, "
        f"batch type {type(batch).__name__}): the DataLoader pins tensors, dicts, lists, tuples and namedtuples; "
        "a custom batch type needs a pin_memory() method"
    )


def default_loss(output, batch):
    """(loss, rule): the model's output when it is a scalar, else cross-entropy against batch[1] or batch['label']."""
    import torch

    if isinstance(output, torch.Tensor) and output.dim() == 0:
        return output, "the model's output (a scalar)"
    if isinstance(batch, dict) and "label" in batch:
        return torch.nn.functional.cross_entropy(output.float(), batch["label"]), "cross-entropy against batch['label']"
    if isinstance(batch, (list, tuple)) and len(batch) > 1:
        return torch.nn.functional.cross_entropy(output.float(), batch[1]), "cross-entropy against batch[1]"
    raise KnobError(
        "knob 'step': no loss: the model's output is not a scalar and the batch has no batch[1] or "
        "batch['label']; allowed: a step (package.module:train_step) returning the loss"
    )


def model_input(batch):
    """What a user model is called with without a step: batch[0] of a list or tuple, else the whole batch."""
    return batch[0] if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields") else batch
