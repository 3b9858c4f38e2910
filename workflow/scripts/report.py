"""Snakemake `script:` of rule report: summary + plots + results + published tables -> results/report/index.html (see
feedbench.report)."""

from feedbench.report import write_report

snakemake = globals()["snakemake"]  # injected by Snakemake
write_report(
    snakemake.input.summary,
    list(snakemake.input.plots),
    list(snakemake.input.results),
    dict(snakemake.params.get("config") or snakemake.config),
    str(snakemake.params.config_hash),
    snakemake.output.html,
    references=list(snakemake.input.get("references", [])),
)
