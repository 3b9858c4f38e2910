"""The core: what every process shares (the knob and metric tables, a cell, a result, the ceilings
and the compute estimate, a machine's cores, memory and /dev/shm, the user's plugins).

Plain Python: the Snakefile's parse imports it for every job, the harness in each cell and the
analysis in the summary, so never torch or pandas; it imports no other layer
(tests/workflow/test_house.py holds it to both).
"""
