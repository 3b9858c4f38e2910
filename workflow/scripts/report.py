"""Snakemake `script:` of rule report: summary, plots, the results' records and the inputs the
report reads by name (feedbench.analysis.report.INPUTS) -> results/report/index.html.

The results are rule aggregate's records of them (results/records.json, feedbench.core.records): no
result.json is opened here.

See feedbench.analysis.publish.report.
"""

import sys

from feedbench.analysis import publish
from feedbench.analysis.report import INPUTS
from feedbench.core.records import load_records

snakemake = globals()["snakemake"]  # injected by Snakemake
# warnings and tracebacks go to the rule's log
sys.stderr = open(snakemake.log[0], "w", buffering=1)

publish.report(
    snakemake.input.summary,
    list(snakemake.input.plots),
    load_records(snakemake.input.records),  # the results the summary was made from, as records
    dict(snakemake.params.get("config") or snakemake.config),
    str(snakemake.params.config_hash),
    snakemake.output.html,
    snakemake.output.verdict,  # the verdicts as text, printed at the run's end
    # paths under the config's folder shown relative to it
    config_dir=snakemake.params.get("config_dir"),
    **{name: snakemake.input.get(name, []) for name in INPUTS},  # the rule's other inputs, by name
)
