"""feedbench: is the GPU starved by its input pipeline, and which knobs fix it?"""

__version__ = "0.1.0"
