"""The package's import graph, read with ast (imports inside functions included, as a lazy import still runs).

The Snakefile checks every cell with feedbench.cell, so cell and what it imports stay free of torch and of the
harness; and no module may import itself back through others (issue #22).
"""

from __future__ import annotations

import ast
import os

PACKAGE = os.path.join(os.path.dirname(__file__), "..", "workflow", "feedbench")
HEAVY = ("torch", "torchvision", "pandas", "matplotlib")
# A cycle left to the layering step: matrix checks `search:` with feedbench.search, which raises
# matrix.ConfigError (issue #22 part 6 moves ConfigError where config reading lives).
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def modules() -> dict[str, str]:
    """Module name, relative to the package ("views.workers", "" for the package itself) -> its file."""
    found = {}
    for folder, subfolders, names in os.walk(PACKAGE):
        subfolders[:] = [d for d in subfolders if d not in ("templates", "schemas", "__pycache__")]
        prefix = os.path.relpath(folder, PACKAGE).replace(os.sep, ".").removeprefix(".")
        for name in names:
            if name.endswith(".py"):
                module = name[:-3] if name != "__init__.py" else ""
                found[".".join(p for p in (prefix, module) if p)] = os.path.join(folder, name)
    return found


def imports(module: str, path: str, known: dict[str, str]) -> tuple[set[str], set[str]]:
    """The package's modules this one imports, and the top-level names of the outside packages it imports."""
    ours, outside = set(), set()
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "feedbench":
                    ours.add(alias.name.removeprefix("feedbench").removeprefix("."))
                else:
                    outside.add(alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module.split(".")[0] == "feedbench":
                target = node.module.removeprefix("feedbench").removeprefix(".")
            else:
                outside.add(node.module.split(".")[0])
                continue
            for alias in node.names:  # `from . import x`: the module x, when there is one
                sub = ".".join(p for p in (target, alias.name) if p)
                ours.add(sub if sub in known else target)
    return {m for m in ours if m in known and m != module}, outside


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    known = modules()
    edges, outside = {}, {}
    for module, path in known.items():
        edges[module], outside[module] = imports(module, path, known)
    return edges, outside


def cycles(edges: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """One cycle for every back edge of a depth-first walk: none found means there is none."""
    found, done = set(), set()

    def walk(module: str, path: list[str]) -> None:
        for target in sorted(edges[module]):
            if target in path:
                cycle = path[path.index(target) :]
                first = cycle.index(min(cycle))
                found.add(tuple(cycle[first:] + cycle[:first]))
            elif target not in done:
                walk(target, [*path, target])
        done.add(module)

    for module in sorted(edges):
        if module not in done:
            walk(module, [module])
    return found


def reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += edges[module]
    return seen


def test_no_module_imports_itself_back():
    edges, _ = graph()
    assert cycles(edges) <= KNOWN_CYCLES, [" -> ".join((*c, c[0])) for c in sorted(cycles(edges) - KNOWN_CYCLES)]


def test_cell_and_what_it_imports_import_no_torch():
    """cell, the knob table and the model names: the planning layer's, whatever function of theirs runs."""
    edges, outside = graph()
    for start in ("cell", "knobs", "model_names"):
        heavy = {m: sorted(outside[m] & set(HEAVY)) for m in reachable(edges, start) if outside[m] & set(HEAVY)}
        assert not heavy, f"feedbench.{start} reaches {heavy}"


def test_model_names_is_a_leaf():
    edges, _ = graph()
    assert edges["model_names"] == set()
