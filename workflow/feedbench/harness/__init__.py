"""The harness layer: one cell measured in PyTorch (the bench job's process).

It may import the planning layer, never the analysis layer (tests/test_house.py).
"""
