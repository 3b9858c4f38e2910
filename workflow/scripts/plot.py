"""Snakemake `script:` of rule plot: summary -> results/plots/<experiment>.svg (see feedbench.plots)."""

import sys

from feedbench.aggregate import read_summary
from feedbench.plots import plot_experiment

snakemake = globals()["snakemake"]  # injected by Snakemake
sys.stderr = open(snakemake.log[0], "w", buffering=1)  # warnings and tracebacks go to the rule's log

plot_experiment(
    read_summary(snakemake.input.summary),
    snakemake.params.experiment,
    snakemake.params.spec,
    snakemake.output.svg,
    title=snakemake.params.get("title", ""),
)
