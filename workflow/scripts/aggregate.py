"""Snakemake `script:` of rule aggregate: every result.json -> results/summary.csv (see feedbench.aggregate)."""

from feedbench.aggregate import load_results, write_summary

snakemake = globals()["snakemake"]  # injected by Snakemake
write_summary(load_results(list(snakemake.input.results)), snakemake.output.summary)
