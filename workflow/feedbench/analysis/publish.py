"""Results -> summary -> plots -> report: the one path from measured cells to the published HTML.

Snakemake's rules aggregate, plot and report run its three steps, one script each
(workflow/scripts/); a run whose Slurm jobs were lost runs all three in-process, from every result
plus the lost cells' records (the Snakefile's onerror: feedbench.plan.slurm.record_lost_cells, then
publish).
"""

from __future__ import annotations

from ..core.ceilings import write_map
from ..core.records import as_records, write_records
from .aggregate import load_results, read_summary, write_summary
from .plots import plot_experiment
from .report import write_report


def summarize(results: list, summary: str, links: dict | None = None, ceilings: str | None = None,
              records: str | None = None) -> None:  # fmt: skip
    """Rule aggregate: every result file, read and validated once (core.records) -> the summary CSV
    (analysis.aggregate), its ceiling columns joined on the planner's map (links:
    feedbench.core.ceilings.ceiling_map), which is written to `ceilings` beside it; the records, in
    the summary's order, to `records`: what the report and the run's end read instead of the result
    files."""
    if ceilings and links is not None:
        write_map(ceilings, links)
    found = as_records(results)
    frame = load_results(found, links)
    write_summary(frame, summary)
    if records:
        by_path = {record.path: record for record in found}
        write_records([by_path[path] for path in frame["result"]] if found else [], records)


def plot(summary: str, experiment: str, spec: dict, svg: str) -> None:
    """Rule plot: an experiment's plot spec (spec: the experiment's config) over the summary -> its
    SVG, titled with the experiment's `title`, else its name (feedbench.analysis.plots)."""
    plot_experiment(
        read_summary(summary), experiment, spec["plot"], svg, title=spec.get("title", experiment)
    )


def report(summary: str, plots: list[str], results: list, config: dict, config_hash: str, html: str,
           verdict: str | None = None, config_dir: str | None = None,
           **inputs) -> None:  # fmt: skip
    """Rule report: summary, plots, the results' records (core.records; or result files, read here)
    and the report's other inputs by name (analysis.report.INPUTS: published tables, searches'
    choices, the planner's map of ceilings, which folds the ceiling cells under the experiments they
    serve, a target's estimates) -> one HTML file (analysis.report), and its verdicts as text at
    `verdict`; `config_dir`: the config's folder, paths under which it shows relative to it."""
    write_report(
        summary, plots, results, config, config_hash, html, verdict=verdict, config_dir=config_dir,
        **inputs
    )  # fmt: skip


def publish(results: list[str], plots: dict[str, str], config: dict, config_hash: str, summary: str, html: str,  # noqa: E501
            **inputs) -> list[str]:  # fmt: skip
    """The three steps at once (plots: experiment -> its SVG, for those with a plot spec; inputs:
    the report's, by name, `ceilings` the planner's map itself, which the summary joins on too);
    returns the files written."""
    records = as_records(results)  # each result read once, for the summary and the report alike
    summarize(records, summary, inputs.get("ceilings"))
    for name, svg in plots.items():
        plot(summary, name, config["experiments"][name], svg)
    report(summary, list(plots.values()), records, config, config_hash, html, **inputs)
    return [summary, *plots.values(), html]
