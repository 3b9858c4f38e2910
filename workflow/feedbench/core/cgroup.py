"""This process's cgroup files, as the limits on its cores and memory are read from them
(core.cores, core.memory).

A limit set on any cgroup above this process's binds it too, so each file is read in its own cgroup
and in every parent up to the root (cgroup v2), plus cgroup v1's file at its controller's root.
Plain Python (the core).
"""

from __future__ import annotations

import os

ROOT = "/sys/fs/cgroup"
PROC = "/proc/self/cgroup"


def read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def own(proc: str = PROC) -> str:
    """This process's cgroup v2 path ("0::/path" in /proc/self/cgroup); "/" when unknown."""
    for line in (read(proc) or "").splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return "/"


def up_the_tree(name: str, root: str = ROOT, proc: str = PROC) -> list[str | None]:
    """The text of the v2 file `name` in this process's cgroup and in each parent up to the root
    (None where absent)."""
    texts = []
    path = own(proc).strip("/")
    while True:
        texts.append(read(os.path.join(root, path, name)))
        if not path:
            return texts
        path = os.path.dirname(path)
