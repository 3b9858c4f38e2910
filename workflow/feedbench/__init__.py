"""feedbench: is the GPU starved by its input pipeline, and which knobs fix it?"""

from .api import measure  # torch-free until called: the Snakefile imports this package
from .version import __version__ as __version__  # a leaf: provenance reads it there

__all__ = ["measure", "stage"]


def __getattr__(name: str):
    """feedbench.stage, imported when first asked for: it needs torch, and the Snakefile imports this package."""
    if name == "stage":
        from .harness.stages import stage

        return stage
    raise AttributeError(f"module 'feedbench' has no attribute {name!r}")
