"""feedbench: is the GPU starved by its input pipeline, and which knobs fix it?"""

from .api import measure  # torch-free until called: the Snakefile imports this package
from .version import __version__ as __version__  # a leaf: provenance reads it there

__all__ = ["measure"]
