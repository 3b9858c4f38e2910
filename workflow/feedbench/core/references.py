"""Which published table each study view shows: report/references/<name>.csv (README there).

No pandas: the Snakefile's parse asks which tables the report needs, and feedbench.analysis.views
reads them.
"""

from __future__ import annotations

import os


def reference_name(spec: dict) -> str:
    """The published table an experiment's view shows: its `reference`, else the view's own name."""
    return spec.get("reference") or spec["view"]


def reference_tables(experiments: dict, folder: str) -> list[str]:
    """The tables in `folder` that the experiments' views show. A view without a table of its name
    shows none; a `reference` naming no table is a ValueError, one line naming the tables there
    are."""
    paths = set()
    for name, spec in experiments.items():
        if not spec.get("view"):
            continue
        path = os.path.join(folder, f"{reference_name(spec)}.csv")
        if os.path.exists(path):
            paths.add(path)
        elif spec.get("reference"):
            known = ", ".join(sorted(f[:-4] for f in os.listdir(folder) if f.endswith(".csv")))
            raise ValueError(
                f"bad config: experiments.{name}.reference: no table {path}; allowed: {known}"
            )
    return sorted(paths)
