"""Results -> summary -> plots -> report: the one path from measured cells to the published HTML.

Snakemake's rules aggregate, plot and report run its three steps, one script each (workflow/scripts/); a run whose
Slurm jobs were lost runs all three in-process, from every result plus the lost cells' records (the Snakefile's
onerror: feedbench.plan.slurm.record_lost_cells, then publish).
"""

from __future__ import annotations

from ..core.ceilings import write_map
from .aggregate import load_results, read_summary, write_summary
from .plots import plot_experiment
from .report import write_report


def summarize(results: list[str], summary: str, links: dict | None = None, ceilings: str | None = None) -> None:
    """Rule aggregate: every result file -> the summary CSV (analysis.aggregate), its ceiling columns joined on the
    planner's map (links: feedbench.core.ceilings.ceiling_map), which is written to `ceilings` beside it."""
    if ceilings and links is not None:
        write_map(ceilings, links)
    write_summary(load_results(results, links), summary)


def plot(summary: str, experiment: str, spec: dict, svg: str) -> None:
    """Rule plot: an experiment's plot spec (spec: the experiment's config) over the summary -> its SVG, titled with
    the experiment's `title`, else its name (feedbench.analysis.plots)."""
    plot_experiment(read_summary(summary), experiment, spec["plot"], svg, title=spec.get("title", experiment))


def report(summary: str, plots: list[str], results: list[str], config: dict, config_hash: str, html: str,
           verdict: str | None = None, **inputs) -> None:  # fmt: skip
    """Rule report: summary, plots, results and the report's other inputs by name (analysis.report.INPUTS: published
    tables, searches' choices, the planner's map of ceilings, which folds the ceiling cells under the experiments
    they serve, a target's estimates) -> one HTML file (analysis.report), and its verdicts as text at `verdict`."""
    write_report(summary, plots, results, config, config_hash, html, verdict=verdict, **inputs)


def publish(results: list[str], plots: dict[str, str], config: dict, config_hash: str, summary: str, html: str,
            **inputs) -> list[str]:  # fmt: skip
    """The three steps at once (plots: experiment -> its SVG, for those with a plot spec; inputs: the report's, by
    name, `ceilings` the planner's map itself, which the summary joins on too); returns the files written."""
    summarize(results, summary, inputs.get("ceilings"))
    for name, svg in plots.items():
        plot(summary, name, config["experiments"][name], svg)
    report(summary, list(plots.values()), results, config, config_hash, html, **inputs)
    return [summary, *plots.values(), html]
