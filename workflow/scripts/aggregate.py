"""Snakemake `script:` of rule aggregate: every result.json -> results/summary.csv, joined on the planner's map of
ceilings, written as results/ceilings.json (feedbench.analysis.publish.summarize)."""

import sys

from feedbench.analysis import publish

snakemake = globals()["snakemake"]  # injected by Snakemake
sys.stderr = open(snakemake.log[0], "w", buffering=1)  # warnings and tracebacks go to the rule's log

# Every input: the planned results, and each gated experiment's results or stopped records (rules/preflight.smk).
publish.summarize(list(snakemake.input), snakemake.output.summary, snakemake.params.ceilings, snakemake.output.ceilings)
