"""The analysis layer: results -> summary -> verdicts, plots and the report (pandas, matplotlib,
Jinja).

It imports the core, never the plan nor the harness layer (tests/workflow/test_house.py).
"""
