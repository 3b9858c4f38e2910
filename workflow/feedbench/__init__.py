"""feedbench: is the GPU starved by its input pipeline, and which knobs fix it?"""

from .api import measure  # torch-free until called: the Snakefile imports this package
from .version import __version__ as __version__  # a leaf: provenance reads it there

__all__ = ["device_work", "measure", "stage"]


def __getattr__(name: str):
    """feedbench.stage and feedbench.device_work, imported when first asked for: they need torch,
    and the Snakefile imports this package."""
    if name == "stage":
        from .harness.stages import stage

        return stage
    if name == "device_work":
        from .harness.timing import device_work

        return device_work
    raise AttributeError(f"module 'feedbench' has no attribute {name!r}")
