"""Snakemake `script:` of rule plot: summary -> results/plots/<experiment>.svg
(feedbench.analysis.publish.plot)."""

import sys

from feedbench.analysis import publish

snakemake = globals()["snakemake"]  # injected by Snakemake
# warnings and tracebacks go to the rule's log
sys.stderr = open(snakemake.log[0], "w", buffering=1)

publish.plot(
    snakemake.input.summary,
    snakemake.params.experiment,
    snakemake.params.spec,
    snakemake.output.svg,
)
