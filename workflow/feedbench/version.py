"""feedbench's version: a leaf, so a result's provenance can name it without importing the package's
entry points."""

__version__ = "0.1.0"
