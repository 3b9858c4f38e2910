"""Snakemake `script:` of rule report: summary + plots + results + published tables -> results/report/index.html (see feedbench.report)."""

import os

from feedbench.report import write_report

snakemake = globals()["snakemake"]  # injected by Snakemake
write_report(
    snakemake.input.summary,
    list(snakemake.input.plots),
    list(snakemake.input.results),
    dict(snakemake.params.get("config") or snakemake.config),
    str(snakemake.params.config_hash),
    snakemake.output.html,
    # The templates live beside the workflow (report/templates), not inside the installed package.
    templates=os.path.join(snakemake.scriptdir, "..", "..", "report", "templates"),
    references=list(snakemake.input.get("references", [])),
)
