"""Snakemake `script:` of rule report: summary, plots, results, published tables -> results/report/index.html.

The results are those the summary lists (feedbench.analysis.report.summary_results), not inputs of the rule.

See feedbench.analysis.publish.report.
"""

import sys

from feedbench.analysis import publish
from feedbench.analysis.report import summary_results

snakemake = globals()["snakemake"]  # injected by Snakemake
sys.stderr = open(snakemake.log[0], "w", buffering=1)  # warnings and tracebacks go to the rule's log

publish.report(
    snakemake.input.summary,
    list(snakemake.input.plots),
    summary_results(snakemake.input.summary),  # the results the summary was made from
    dict(snakemake.params.get("config") or snakemake.config),
    str(snakemake.params.config_hash),
    snakemake.output.html,
    references=list(snakemake.input.get("references", [])),
    searches=list(snakemake.input.get("searches", [])),
    ceilings=snakemake.input.get("ceilings"),  # the planner's map: ceiling cells fold under what they serve
    target=next(iter(snakemake.input.get("target", [])), None),
)
