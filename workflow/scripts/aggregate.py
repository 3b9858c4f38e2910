"""Snakemake `script:` of rule aggregate: every result.json, read once -> results/summary.csv,
joined on the planner's map of ceilings, written as results/ceilings.json, and the results' records,
results/records.json, which the later rules read (feedbench.analysis.publish.summarize)."""

import sys

from feedbench.analysis import publish
from feedbench.core import preflight

snakemake = globals()["snakemake"]  # injected by Snakemake
# warnings and tracebacks go to the rule's log
sys.stderr = open(snakemake.log[0], "w", buffering=1)

# Every input: the planned results, and each gated experiment's results or, when its preflight
# stopped it, the preflight's record, from which each of its cells gets a stopped record, read in
# place of its result.
results = preflight.with_stopped_cells(list(snakemake.input), snakemake.params.stopped)
output = snakemake.output
publish.summarize(
    results, output.summary, snakemake.params.ceilings, output.ceilings, output.records
)
