"""The plan: what the Snakefile and the CLI run, from a config to checked cells, jobs and Slurm
resources.

Plain Python on the core: the Snakefile's parse runs it for every job, so it never imports torch,
torchvision, pandas or matplotlib; the harness and the analysis never import it
(tests/workflow/test_house.py holds it to both).
"""
