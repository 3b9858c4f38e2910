"""The package's house rules, read from its source with ast, lazy imports inside functions included.

Four layers, each a subpackage. The core (knobs, cells, results, metrics, ceilings, the estimate, a
machine's cores, memory and /dev/shm, the user's plugins) is what every process shares: all import
it, it imports no other layer. The plan (config -> checked cells, jobs, Slurm) is what the Snakefile
runs: only the workflow (Snakefile, workflow/rules, workflow/scripts) and the CLI (__main__) import
it. The harness (one cell measured in PyTorch) and the analysis (results -> summary -> report)
import the core, never the plan nor each other. Core and plan are plain Python, because the
Snakefile's parse runs them. The entry points at the top (__main__, api) may reach any layer but api
the plan. No import cycle, and no function longer than a reader can hold. `make lint` runs this
file.

It reads the package of the checkout it stands in (found from this file's path, never through
`import feedbench`, which a venv installed from another checkout would answer with that checkout's
copy), and counts as imports `importlib.import_module("x")` and `__import__("x")` beside the import
statements. The core, the plan and the harness name the third-party packages they may import (an
allow-list: a new dependency is a decision made here); the analysis, the packages it must not.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = Path(ROOT) / "workflow" / "feedbench"
TESTS = Path(ROOT) / "tests"  # conftest and the helpers package, which benchmarks import too
LAYERS = ("core", "plan", "harness", "analysis")
MAY_IMPORT = {
    "core": {"core"},
    "plan": {"core", "plan"},
    "harness": {"core", "harness"},
    "analysis": {"core", "analysis"},
}
# The modules at the top that may import the plan: the CLI (the workflow's Snakefile, rules and
# scripts sit outside the package; tests/ and benchmarks/ may reach anything they test or time).
PLAN_ENTRY = {"feedbench.__main__"}
# Third-party packages the core, the plan and the harness may import, all they may: the core and the
# plan run in Snakemake's parse of every job, so nothing heavy; the harness measures one cell, so
# nothing of the analysis (pandas, matplotlib). snakemake: planned_cell checks a cell id with the
# workflow's own rule (snakemake.io), lazily.
CORE_ALLOWED = {"jsonschema", "snakemake", "yaml"}
PLAN_ALLOWED = CORE_ALLOWED | {
    "snakemake_executor_plugin_slurm",
    # the executors' base class, which plan.slurm patches as the plugin
    "snakemake_interface_executor_plugins",
}
ALLOWED = {
    "core": CORE_ALLOWED,
    "plan": PLAN_ALLOWED,
    "harness": CORE_ALLOWED
    | {"PIL", "numpy", "psutil", "pyarrow", "pynvml", "torch", "torchvision", "webdataset"},
}
# Third-party packages the analysis must not import: it reads results, it runs no cell.
NOT_IN = {"analysis": {"torch", "torchvision"}}
# Leaves at the top that every layer may import: the version.
SHARED = {"feedbench.version"}
MAX_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _dynamic(node: ast.AST) -> str | None:
    """The module an `importlib.import_module("x")` or `__import__("x")` call names, where it is a
    literal."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    named = (
        func.attr
        if isinstance(func, ast.Attribute)
        else func.id
        if isinstance(func, ast.Name)
        else None
    )
    first = node.args[0]
    literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
    return first.value if named in ("import_module", "__import__") and literal else None


def _absolute(package: str, module: str | None, level: int) -> str:
    """A relative import's module (`from ..plan import x` in feedbench.harness: feedbench.plan)."""
    parts = package.split(".")
    return ".".join(parts[: len(parts) - level + 1] + ([module] if module else []))


def imports(name: str) -> tuple[set[str], set[str]]:
    """The package modules and the third-party top-level packages that module `name` imports."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    inside, outside = set(), set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(package, node.module, node.level) if node.level else node.module
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        elif _dynamic(node):
            module = _dynamic(node)
            dots = len(module) - len(module.lstrip("."))
            targets = [_absolute(package, module[dots:] or None, dots) if dots else module]
        else:
            continue
        for target in targets:
            if target.split(".")[0] == "feedbench":
                inside.add(target)
            elif target.split(".")[0] not in sys.stdlib_module_names:
                outside.add(target.split(".")[0])
    inside.discard(name)
    return inside, outside


def layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_every_module_sits_in_a_layer_or_is_an_entry_point():
    entry = {"feedbench", "feedbench.__main__", "feedbench.api"}
    loose = sorted(n for n in MODULES if layer(n) is None and n not in entry | SHARED)
    assert not loose, (
        f"modules outside the layers: {loose}; allowed: core/, plan/, harness/ or analysis/"
    )


@pytest.mark.parametrize("name", [n for n in MODULES if layer(n)])
def test_a_module_imports_only_its_layer_and_those_below(name):
    inside, outside = imports(name)
    own = layer(name)
    above = sorted(t for t in inside - SHARED if layer(t) not in MAY_IMPORT[own])
    assert not above, (
        f"{name} ({own} layer) imports {above}; allowed: the "
        f"{' and '.join(sorted(MAY_IMPORT[own]))} layer"
    )
    if own in ALLOWED:
        foreign = sorted(outside - ALLOWED[own])
        assert not foreign, (
            f"{name} ({own} layer) imports {foreign}; allowed: {sorted(ALLOWED[own])} and the "
            "standard library"
        )
    heavy = sorted(outside & NOT_IN.get(own, set()))
    assert not heavy, f"{name} ({own} layer) imports {heavy}"


def test_only_the_cli_and_the_plan_import_the_plan():
    """Outside its own layer the plan has one importer in the package, the CLI: the harness and the
    analysis take what they share with it from the core, and api (a cell from a notebook) plans
    nothing."""
    found = sorted(
        f"{name} imports {sorted(t for t in imports(name)[0] if layer(t) == 'plan')}"
        for name in MODULES
        if layer(name) != "plan"
        and name not in PLAN_ENTRY
        and any(layer(t) == "plan" for t in imports(name)[0])
    )
    assert not found, f"{found}; allowed: the plan's own modules and {sorted(PLAN_ENTRY)}"


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


BENCHMARKS = PACKAGE.parent.parent / "benchmarks"
SCRIPTS = PACKAGE.parent / "scripts"


def test_no_module_imports_another_modules_private_name():
    """`from x import _name` across modules: a private name a second module needs is part of x's
    interface, so it is named as such (the package, the rules' scripts and the benchmarks; a test
    may reach inside what it tests)."""
    found = []
    for path in sorted([*PACKAGE.rglob("*.py"), *SCRIPTS.glob("*.py"), *BENCHMARKS.glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                private = [
                    a.name
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
                found += [
                    f"{path.name}:{node.lineno}: from {node.module} import {name}"
                    for name in private
                ]
    assert not found, found


@pytest.mark.parametrize(
    "script", sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
)
def test_a_benchmark_imports_the_package_of_its_own_checkout(script):
    """A script that imports feedbench (or the tests' helpers) imports benchmarks/_checkout.py
    first, which puts this checkout's workflow/ and tests/ first on the path: run without
    PYTHONPATH, it must not measure the venv's copy."""
    tree = ast.parse((BENCHMARKS / script).read_text())
    lines = {}
    for node in tree.body:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        for top in {n.split(".")[0] for n in names}:
            lines.setdefault(top, node.lineno)
    ours = [
        n
        for n in lines
        if n == "feedbench" or (TESTS / f"{n}.py").exists() or (TESTS / n / "__init__.py").exists()
    ]
    if ours:
        first = min(lines[n] for n in ours)
        assert lines.get("_checkout", first + 1) < first, (
            f"benchmarks/{script} imports {ours} before _checkout"
        )
