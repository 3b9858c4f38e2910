"""The planning layer: from a config to checked cells, jobs and Slurm resources.

Plain Python: it never imports torch, torchvision, pandas or matplotlib, because the Snakefile's parse runs it
for every job (tests/test_house.py holds it to that).
"""
