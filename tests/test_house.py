"""The package's house rules (issue #22), read from its source with ast, lazy imports inside functions included.

Three layers, each a subpackage: plan (config -> checked cells, jobs, Slurm: plain Python, because the Snakefile's
parse runs it), harness (one cell measured in PyTorch) and analysis (results -> summary -> report). A layer imports
itself and the layers below it: plan nothing above it, harness and analysis the plan but never each other. The
entry points at the top (__main__, api) may reach any layer. No import cycle, and no function longer than a reader
can hold. `make lint` runs this file.
"""

from __future__ import annotations

import ast
from pathlib import Path

import feedbench
import pytest

PACKAGE = Path(feedbench.__file__).parent
LAYERS = ("plan", "harness", "analysis")
MAY_IMPORT = {"plan": {"plan"}, "harness": {"plan", "harness"}, "analysis": {"plan", "analysis"}}
# Third-party packages a layer must not import: the plan runs in Snakemake's parse of every job, so nothing heavy.
NOT_IN = {
    "plan": {"torch", "torchvision", "pandas", "matplotlib", "numpy"},
    "harness": {"pandas", "matplotlib"},
    "analysis": {"torch", "torchvision"},
}
# Leaves at the top that every layer may import: the version.
SHARED = {"feedbench.version"}
MAX_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str) -> tuple[set[str], set[str]]:
    """The package modules and the third-party top-level packages that module `name` imports."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    inside, outside = set(), set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            targets = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module for a in node.names
            ]
        else:
            continue
        for target in targets:
            if target.split(".")[0] == "feedbench":
                inside.add(target)
            else:
                outside.add(target.split(".")[0])
    inside.discard(name)
    return inside, outside


def layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_every_module_sits_in_a_layer_or_is_an_entry_point():
    entry = {"feedbench", "feedbench.__main__", "feedbench.api"}
    loose = sorted(n for n in MODULES if layer(n) is None and n not in entry | SHARED)
    assert not loose, f"modules outside the layers: {loose}; allowed: plan/, harness/ or analysis/"


@pytest.mark.parametrize("name", [n for n in MODULES if layer(n)])
def test_a_module_imports_only_its_layer_and_those_below(name):
    inside, outside = imports(name)
    own = layer(name)
    above = sorted(t for t in inside - SHARED if layer(t) not in MAY_IMPORT[own])
    assert not above, (
        f"{name} ({own} layer) imports {above}; allowed: the {' and '.join(sorted(MAY_IMPORT[own]))} layer"
    )
    heavy = sorted(outside & NOT_IN[own])
    assert not heavy, f"{name} ({own} layer) imports {heavy}"


def test_the_package_has_no_import_cycle():
    graph = {name: {t for t in imports(name)[0] if t in MODULES} for name in MODULES}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            pytest.fail("import cycle: " + " -> ".join(path[path.index(name) :] + [name]))
        if name in done:
            return
        for target in sorted(graph[name]):
            visit(target, path + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_no_function_is_longer_than_a_reader_can_hold():
    long = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                if node.end_lineno - first + 1 > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {node.end_lineno - first + 1} lines")
    assert not long, f"over {MAX_FUNCTION_LINES} lines: {long}"
