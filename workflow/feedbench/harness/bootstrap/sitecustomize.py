"""feedbench's bootstrap in a command it measures (harness.command puts this folder first on the
command's PYTHONPATH): the instrument (harness.inloop) is installed the moment the command imports
torch, before any line of it builds a DataLoader. Nothing of the user's code changes, and a
process that never imports torch (a shell helper, a tokenizer's) pays one environment lookup.

Standard library only, until torch is imported: the command's interpreter may be another
environment's. feedbench itself is found where the harness says it is (FEEDBENCH_PACKAGE), by name
alone, so nothing else of the harness's environment comes onto the command's path. A
sitecustomize of the command's own environment, which this one shadows, still runs (last).
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


class _Feedbench(importlib.abc.MetaPathFinder):
    """`feedbench` from the package folder the harness names, where the command's environment has
    none."""

    def __init__(self, package: str):
        self.package = package

    def find_spec(self, name, path=None, target=None):
        if name != "feedbench":
            return None
        init = os.path.join(self.package, "__init__.py")
        return importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[self.package]
        )


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Runs feedbench.harness.patches.install() once `torch` has been imported."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once; and torch's own spec is found by the others
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            import feedbench.harness.patches

            feedbench.harness.patches.install()

        spec.loader.exec_module = exec_module
        return spec


def _activate() -> None:
    if not os.environ.get("FEEDBENCH_COMMAND_SPEC") or "torch" in sys.modules:
        return
    package = os.environ.get("FEEDBENCH_PACKAGE")
    if package and importlib.util.find_spec("feedbench") is None:
        sys.meta_path.append(_Feedbench(package))
    sys.meta_path.insert(0, _AfterTorch())


def _chain() -> None:
    """The environment's own sitecustomize, which this file shadows on the path."""
    others = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_activate()
_chain()
