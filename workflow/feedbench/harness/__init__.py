"""The harness layer: one cell measured in PyTorch (the bench job's process).

It imports the core, never the plan nor the analysis layer (tests/workflow/test_house.py).
"""
