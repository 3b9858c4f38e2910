"""feedbench: is the GPU starved by its input pipeline, and which knobs fix it?"""

__version__ = "0.1.0"

from .api import measure  # noqa: E402  (torch-free until called: the Snakefile imports this package)

__all__ = ["measure"]
