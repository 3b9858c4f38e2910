"""Snakemake `script:` of rule aggregate: every result.json -> results/summary.csv (see feedbench.aggregate)."""

import sys

from feedbench.aggregate import load_results, write_summary

snakemake = globals()["snakemake"]  # injected by Snakemake
sys.stderr = open(snakemake.log[0], "w", buffering=1)  # warnings and tracebacks go to the rule's log

write_summary(load_results(list(snakemake.input.results)), snakemake.output.summary)
