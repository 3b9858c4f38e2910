"""The analysis layer: results -> summary -> verdicts, plots and the report (pandas, matplotlib, Jinja).

It may import the planning layer, never the harness layer (tests/test_house.py).
"""
