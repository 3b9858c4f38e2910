"""A fake /sys/fs/cgroup for the limits that core.cgroup reads (tests/core/test_cores.py,
tests/core/test_memory.py)."""

from __future__ import annotations


def cgroup_tree(
    tmp_path, name: str, limits: dict[str, str], own: str = "/job/step"
) -> tuple[str, str]:
    """A cgroup tree with the file `name` (cpu.max, memory.max) at the given paths, and a
    /proc/self/cgroup naming `own`: (root, proc) for core.cgroup."""
    root = tmp_path / "cgroup"
    for path, text in limits.items():
        folder = root / path.strip("/")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text + "\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text(f"0::{own}\n")
    return str(root), str(proc)
