"""Render the summary, the plots and the results' provenance into one self-contained HTML file.

Self-contained means: CSS and SVG inline, no request to any network, so the
file can be mailed, archived or published as it is. Every value goes through
Jinja's autoescape; the only markup inserted as is are our own matplotlib
SVGs, and only after `inline_svg` has checked that they carry no script, no
event handler and no link outside the document.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from importlib import metadata
from typing import Callable

import jinja2
import numpy as np
import pandas as pd
import yaml
from markupsafe import Markup, escape

from ..core import attempts, search
from ..core.ceilings import read_map
from ..core.cores import CPU_BOUND_SHARE
from ..core.preflight import STOPPED_BY_BOUNDED, STOPPED_TYPE
from ..core.records import Record, as_records
from ..core.references import reference_name
from ..core.result import atomic_write
from . import (
    accuracy,
    command,
    glossary,
    headline,
    knee,
    other_load,
    served,
    stages,
    target_view,
    threads,
    verdict,
    views,
    whatifs,
)
from .aggregate import read_summary, requested
from .disclosure import Disclosure
from .labels import ONE_CELL
from .plots import plain_text, stage_figure, svg_text

TEMPLATES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "templates"
)  # package data, installed with it

# What the report says about where results came from: an allow-list, never the whole environment.
PROVENANCE_FIELDS = [
    "host",
    "os",
    "cpu",
    "cpu_count",
    "ram_gb",
    "gpu",
    "gpu_count",
    "driver",
    "cuda",
    "cudnn",
    "torch",
    "torchvision",
    "python",
    "software_of",
    "feedbench",
    "git_commit",
    "slurm_job_id",
]
ERROR_LINES = 8

_FORBIDDEN_TAGS = {"script", "foreignobject", "iframe", "object", "embed"}
# CSS may only point at ids of the page
_OUTSIDE_CSS = re.compile(r"@import|url\(\s*['\"]?(?!#)", re.I)


class UnsafeSVG(ValueError):
    """An SVG that would run code or load something if inlined."""


def inline_svg(text: str) -> Markup:
    """Our matplotlib SVG as markup for the page: the prolog dropped, checked to be inert."""
    start = text.find("<svg")
    if start < 0:
        raise UnsafeSVG("no <svg> element")
    svg = text[start:]
    for element in ET.fromstring(svg).iter():
        tag = element.tag.rsplit("}", 1)[-1].lower()
        if tag in _FORBIDDEN_TAGS:
            raise UnsafeSVG(f"<{tag}> is not allowed in an inline figure")
        for name, value in element.attrib.items():
            local = name.rsplit("}", 1)[-1].lower()
            if local.startswith("on"):
                raise UnsafeSVG(f"event handler attribute {local} is not allowed")
            if local == "href" and not (value.startswith("#") or value.startswith("data:image/")):
                raise UnsafeSVG(f"link {value!r} leaves the document")
            if _OUTSIDE_CSS.search(value):
                raise UnsafeSVG(f"style {value!r} refers outside the document")
        if element.text and _OUTSIDE_CSS.search(element.text) and tag == "style":
            raise UnsafeSVG("a <style> of the figure refers outside the document")
    return Markup(svg)


def fmt(value, digits: int = 3) -> str:
    """A number for people: about `digits` significant figures, thousands separated, no exponent
    above 1; '–' when missing."""
    if isinstance(value, str):
        return value
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value)).lower()
    # a mapping knob such as dataset_args, as the summary writes it
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True)
    if not isinstance(value, numbers.Real):
        return str(value)
    if isinstance(value, numbers.Integral):
        return f"{value:,}"
    if abs(value) >= 1:
        decimals = max(digits - len(str(int(abs(value)))), 0)
        return f"{value:,.{decimals}f}"
    return f"{value:.{digits}g}"


def breakable(text) -> Markup:
    """Text that may wrap after `_` and `-` (a <wbr> there), so a long cell id never pushes the page
    sideways."""
    return Markup("").join(
        Markup("{}<wbr>").format(part) if part[-1:] in "_-" else escape(part)
        for part in re.split(r"(?<=[_-])", str(text))
        if part
    )


# characters of a cell id a table shows; a longer one is cut in the middle, whole in its tooltip
LONGEST_ID = 60


def short_id(text) -> str:
    """A cell id as a table shows it: whole up to LONGEST_ID characters, else its start and its end
    (where a user's id keeps its hash) around an ellipsis; the whole id is the tooltip and in the
    provenance's list of cell ids."""
    text = str(text)
    if len(text) <= LONGEST_ID:
        return text
    return f"{text[: LONGEST_ID - 16]}…{text[-15:]}"


def cut_ids(summary: pd.DataFrame) -> list[str]:
    """experiment/cell of every cell whose id a table cuts (short_id): the provenance lists them
    whole."""
    cells = summary[["experiment", "cell"]].drop_duplicates().itertuples(index=False)
    return [f"{experiment}/{cell}" for experiment, cell in cells if len(str(cell)) > LONGEST_ID]


def _same(a, b) -> bool:
    """Equal as the report shows values: True, 'True' and 'true' alike, 2 and 2.0 alike, a mapping
    and its JSON."""
    a, b = (json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v for v in (a, b))
    if all(v is None or pd.isna(v) for v in (a, b)):
        return True  # a knob left unset, asked and run alike (NaN is not equal to itself)
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a).lower() == str(b).lower()


def axis_values(rows: pd.DataFrame, cells: list[dict], columns: list[str]) -> None:
    """Give each cell record `shown`: per column, (text, why) where why says how the harness
    adjusted the value the matrix asked for (say 'true → false' with 'pin_memory=true ignored: no
    accelerator to pin for'), else None."""
    first = rows.drop_duplicates("cell").set_index("cell")
    for cell in cells:
        row = first.loc[cell["cell"]] if cell["cell"] in first.index else {}
        asked_for = requested(row.get("requested"))
        notes = str(row.get("adjustments") or "").split("; ")
        shown = {}
        for k in columns:
            ran = row.get(k) if k in row else cell.get(k)
            asked = asked_for.get(k, ran)
            if asked is not None and not _same(asked, ran):
                why = next(
                    (n for n in notes if n.startswith(f"{k}=")),
                    "adjusted by the harness to fit this machine",
                )
                shown[k] = (f"{fmt(asked)} → {fmt(ran)}", why)
            else:
                shown[k] = (fmt(ran), None)
        cell["shown"] = shown


def _knob_text(cell: dict | pd.Series, knobs: list[str]) -> str:
    return ", ".join(f"{k}={fmt(cell[k])}" for k in knobs) or "(the only cell)"


def _error_tail(error: dict, fallback: str | None) -> str:
    """The last lines of a failed cell's traceback (or its message when it has none)."""
    text = error.get("traceback") or error.get("message") or fallback or "no error recorded"
    return "\n".join(text.rstrip().splitlines()[-ERROR_LINES:])


def provenance_table(records: list[Record], withheld: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Each allow-listed field (less `withheld`) with the distinct values the results' records
    report (several hosts show as several values), then the Snakemake version and when the cells
    ran."""
    values: dict[str, set] = {name: set() for name in PROVENANCE_FIELDS if name not in withheld}
    span = []
    for record in records:
        if record.damaged:
            continue
        for name in values:
            value = record.provenance.get(name)
            if value is not None:
                values[name].add(str(value))
        span += [t for t in (record.started_at, record.finished_at) if t]
    # every field shown, '–' where no result knows it
    out = {name: sorted(v) or ["–"] for name, v in values.items()}
    try:
        out["snakemake"] = [metadata.version("snakemake")]
    except metadata.PackageNotFoundError:
        pass
    if span:
        out["cells ran"] = [f"{min(span)} to {max(span)}"]
    return out


def _experiments(summary: pd.DataFrame, config: dict) -> list[tuple[str, dict]]:
    """Experiments in config order, then any the summary has that the config does not name."""
    declared = dict((config or {}).get("experiments") or {})
    for name in summary["experiment"].dropna().unique():
        declared.setdefault(str(name), {})
    return list(declared.items())


def _records(frame: pd.DataFrame) -> list[dict]:
    """DataFrame rows as dicts with None where pandas has NaN, so templates test one kind of
    missing."""
    return [
        {
            k: (None if not isinstance(v, (list, dict, str)) and pd.isna(v) else v)
            for k, v in row.items()
        }
        for row in frame.to_dict("records")
    ]


def _empty_context(name: str, spec: dict, svg: Markup | None) -> dict:
    """An experiment's section before its results are read: what it shows when it has none."""
    return {
        "name": name,
        "title": spec.get("title") or name,
        "base": spec.get("base") or {},
        "matrix": spec.get("matrix") or {},
        "svg": svg,
        "stages_svg": None,
        "profiled_functions": [],
        "view": None,
        "cells": [],
        "columns": [],
        "metric": None,
        "unit": "",
        "knobs": [],
        "verdict": None,
        "headline": None,
        "best_id": None,
        "baseline_id": None,
        "note": "no result for this experiment",
        "adjusted": [],
        "attempts": [],
        "threads": None,
        "has_speedup": False,
        "has_efficiency": False,
        "has_prediction": False,
        "has_epoch_stall": False,
        "has_memory_growth": False,
        "whatifs": [],
        "has_workers_kind": False,
        "search": None,
        "worker_count": [],
        "ceilings": [],
        "command": [],
    }


def _has_values(cells: pd.DataFrame, column: str) -> bool:
    """Whether any cell has a value in `column` (a column the summary may lack)."""
    return bool(cells[column].notna().any()) if column in cells else False


def _verdict_context(found: dict) -> dict:
    """The experiment's verdict line: its best cell, against the baseline, and what bounds it."""
    best, base = found["best"], found["baseline"]
    return {
        "best": _knob_text(best, found["knobs"]),
        "best_median": best["median"],
        "speedup": found["speedup"],
        "beyond_noise": found["clear"],
        "wording": found["wording"],
        "baseline": _knob_text(base, found["knobs"]) if base else None,
        "baseline_median": base["median"] if base else None,
        "bound": best["bound"],
        "why": best["why"],
        "baseline_bound": base["bound"] if base else None,
        "recommendation": found["recommendation"],
        "time_lost": found["time_lost"],
        "memory": found["memory"],
        "cores": found["cores"],
    }


def attempt_rows(rows: pd.DataFrame) -> list[dict]:
    """Each cell and repeat whose result is not its first attempt, with its attempts in words
    ("attempt 2; attempt 1 lost to NODE_FAIL after 51 steps"), from the attempts/ folder beside its
    result (core.attempts)."""
    found = []
    for row in rows.to_dict("records"):
        path = row.get("result")
        text = attempts.earlier_text(os.path.dirname(path)) if isinstance(path, str) else None
        if text:
            found.append({"cell": row["cell"], "repeat": row["repeat"], "text": text})
    return found


def experiment_context(name: str, spec: dict, rows: pd.DataFrame, svg: Markup | None) -> dict:
    """What one experiment's section and its verdict line show."""
    context = _empty_context(name, spec, svg)
    if rows.empty:
        return context
    # The baseline is the cell its results label so; the matrix (when the config names one) orders
    # the knobs.
    found = verdict.summarize_experiment(rows, (spec or {}).get("matrix"))
    best, base = found["best"], found["baseline"]
    # Every matrix axis is a column, even one the harness adjusted away (pin_memory on a CPU), then
    # any other knob that varies; the short label names only the knobs whose values differ between
    # the cells.
    matrix = (spec or {}).get("matrix") or {}
    columns = [k for k in matrix if k in rows] + [k for k in found["knobs"] if k not in matrix]
    # each with its label (verdict.label_cells), as the verdict's sentences name it
    cells = _records(found["cells"])
    axis_values(rows, cells, columns)
    context.update(
        cells=cells,
        metric=found["metric"],
        unit=verdict.unit(rows),
        knobs=found["knobs"],
        columns=columns,
        best_id=best["cell"] if best else None,
        baseline_id=base["cell"] if base else None,
        note=found["note"],
        adjusted=_records(
            rows.dropna(subset=["adjustments"]).drop_duplicates("cell")[["cell", "adjustments"]]
        )
        if "adjustments" in rows
        else [],
        attempts=attempt_rows(rows),
        # the knob's threads where they differ from the launch's
        threads=threads.note(rows, found["metric"]),
        has_speedup="speedup" in found["cells"] and len(found["cells"]) > 1,
        has_efficiency="efficiency" in found["cells"],
        has_prediction=_has_values(found["cells"], "predicted"),
        has_epoch_stall=_has_values(found["cells"], "epoch_stall_ms"),
        has_memory_growth=_has_values(found["cells"], "growth_mb_per_1k"),
        # the top stages' what-ifs, predicted (whatifs)
        whatifs=whatifs.experiment_table(rows, found["metric"]),
        has_workers_kind=_has_values(found["cells"], "workers_kind"),
    )
    labels = {cell["cell"]: cell["label"] for cell in cells}
    for row in context["whatifs"]:
        row["label"] = labels.get(row["cell"], row["cell"])
    if best is not None:
        context["verdict"] = _verdict_context(found)
        context["headline"] = headline.lines(found, rows, context["unit"], context["whatifs"], fmt)
    # a command experiment: the loader its loop trains on, and the instrument's fidelity
    context["command"] = command.lines(rows, fmt)
    return context


def _times(rate: float | None, factor: float | None) -> float | None:
    """A samples/s rate in the experiment's unit; None where either is unknown."""
    return None if rate is None or factor is None else rate * factor


def target_in_units(target: dict, summary: pd.DataFrame) -> dict:
    """The section "On <target>" with each cell's rates in its experiment's unit (verdict.unit), as
    every other section shows them: the estimate (core.estimate) counts samples/s, times the cell's
    tokens per sample here where its pipeline counts tokens (unknown, so left out, where the cell
    measured none)."""
    for row in target["rows"]:
        experiment, _, cell = row["cell"].partition("/")
        own = summary[summary["experiment"] == experiment]
        factor = verdict.per_sample(
            own[(own["cell"] == cell) & (own["status"] == "ok")], verdict.objective(own)
        )
        row["unit"] = verdict.unit(own)
        for key in ("predicted", "compute_ceiling"):
            if key in row:
                row[key] = _times(row[key], factor)
        if row.get("predicted_range") is not None:  # [fastest, slowest], slowest None where open
            row["predicted_range"] = [_times(rate, factor) for rate in row["predicted_range"]]
    return target


def study_view(
    name: str,
    spec: dict,
    rows: pd.DataFrame,
    references: dict[str, str],
    estimates: dict | None = None,
) -> dict | None:
    """The experiment's study view (analysis.views), with the published table beside it, ready for
    the template; with a target's estimates, the published cells' predictions beside their figures
    (target_view.beside_published)."""
    if not spec.get("view"):
        return None
    name_of_table = reference_name(spec)
    reference = (
        views.read_reference(references[name_of_table]) if name_of_table in references else None
    )
    with plain_text():  # user strings in the view's figure are text, never matplotlib math
        # the view says so when its table is missing
        view = views.builder(spec["view"])(rows, reference, spec)
    predicted, notes = target_view.beside_published(estimates, spec["view"])
    if predicted is not None:
        view.tables.append(predicted)
        view.notes += notes
    return {
        "name": view.name,
        "paragraphs": [p.strip() for p in view.text.strip().split("\n\n") if p.strip()],
        "tables": view.tables,
        "verdict": view.verdict,
        "notes": view.notes,
        "svg": inline_svg(svg_text(view.figure, salt=f"{name}-view"))
        if view.figure is not None
        else None,
    }


def stages_svg(name: str, spec: dict, rows: pd.DataFrame) -> Markup | None:
    """The stacked bar of stage time per sample for each cell, when the experiment's cells timed
    their stages."""
    fig = stage_figure(rows, spec.get("title") or name)
    return inline_svg(svg_text(fig, salt=f"{name}-stages")) if fig is not None else None


def _search_context(
    name: str, spec: dict, context: dict, rows: pd.DataFrame, decided: str | None
) -> None:
    """`search: num_workers`: which levels ran (the checkpoint's choice, feedbench.core.search;
    every level for loader cells) and the worker count with its proof, from the cells that ran
    (analysis.knee)."""
    if not (spec or {}).get("search") and decided is None:
        return
    cells = pd.DataFrame(context["cells"])
    if decided is not None:
        decision = search.read(decided)
    elif context["cells"]:
        decision = knee.measured_search(name, spec, cells, context["knobs"], context["baseline_id"])
    else:
        return
    context["search"] = search.sentence(decision)
    if context["cells"]:
        context["worker_count"] = knee.proof(decision, cells, rows, context["unit"], fmt)


def _runs_failed(failed: int, runs: int) -> str:
    """`failed` of `runs` in words that follow the counts: never "the rest completed" when none
    did."""
    if failed == runs:
        return "the only run failed" if runs == 1 else f"all {runs} runs failed"
    return f"{failed} of {runs} runs failed, {runs - failed} completed"


def _none_started(runs: int) -> str:
    return "its only run not started" if runs == 1 else f"none of its {runs} runs started"


def failure_rows(failed: pd.DataFrame, records: list[Record] = ()) -> list[dict]:
    """Each failed run as the section lists it: its cell, its error and the last lines of its
    traceback (its record's, by the summary's `result` column)."""
    errors = {record.path: record.error for record in records}
    return [
        {
            "experiment": r["experiment"],
            "cell": r["cell"],
            "repeat": r["repeat"],
            "type": r["error_type"],
            "message": r["error_message"],
            "tail": _error_tail(errors.get(r.get("result")) or {}, r["error_message"]),
        }
        for r in failed.to_dict("records")
    ]


def failure_counts(summary: pd.DataFrame) -> dict | None:
    """The failed cells' section in sentences: the whole run, then, where the run had more than one
    experiment, each experiment that had a failed run. None when no run failed."""
    failed = summary["status"] != "ok"
    if not failed.any():
        return None
    by_experiment = failed.groupby(summary["experiment"], sort=False).agg(["sum", "size"])
    # An experiment stopped by its preflight (feedbench.core.preflight): every row its stopped
    # record, none ran.
    stopped = (
        summary["error_type"].eq(STOPPED_TYPE).groupby(summary["experiment"], sort=False).all()
    )
    # a ceiling experiment's cells stopped by the preflight of the experiments they bound
    messages = summary.get("error_message", pd.Series("", index=summary.index)).fillna("")
    bounded = (
        messages.astype(str)
        .str.startswith(STOPPED_BY_BOUNDED)
        .groupby(summary["experiment"], sort=False)
        .all()
    )
    overall = _runs_failed(int(failed.sum()), len(summary))
    return {
        "overall": f"{overall[0].upper()}{overall[1:]}.",
        "experiments": [
            f"Experiment {name}: stopped by "
            f"{'the preflight of the experiments it bounds' if bounded[name] else 'its preflight'}"
            f", {_none_started(int(row['size']))}."
            if stopped[name]
            else f"Experiment {name}: {_runs_failed(int(row['sum']), int(row['size']))}."
            for name, row in by_experiment.iterrows()
            if stopped[name] or (row["sum"] and len(by_experiment) > 1)
        ],
    }


def _files(given) -> list[str]:
    """An input's files as a list: Snakemake gives a named input of one file as its path."""
    return [given] if isinstance(given, str) else list(given or [])


def _by_name(given) -> dict[str, str]:
    """Files by their name less the extension: an experiment's plot, a study's published table, a
    search's choice."""
    return {os.path.splitext(os.path.basename(p))[0]: p for p in _files(given)}


def _ceilings(given) -> dict | None:
    """The planner's map of which cells bound each training cell: as given where already read (a run
    that lost Slurm jobs), else read from its file (results/ceilings.json); None without one."""
    if isinstance(given, dict):
        return given
    files = _files(given)
    return read_map(files[0]) if files else None


def _estimates(given) -> dict | None:
    """A target's estimates (results/target.json), read once; None without a target."""
    files = _files(given)
    return target_view.read_estimates(files[0]) if files else None


# The report's inputs beside its summary, plots and results: by the name rule report gives each,
# which is also its keyword in write_report, publish.report and publish.publish, how its files are
# read (once, into Page.inputs). A new input is a line here, its files in rule report's input
# (common.smk: REPORT_INPUTS) and the section that reads it.
INPUTS = {"references": _by_name, "searches": _by_name, "ceilings": _ceilings, "target": _estimates}


@dataclass(frozen=True)
class Page:
    """What every section reads: the summary, the plots by experiment, the records of the results it
    was made from (core.records), the config, the inputs as read (INPUTS) and what the report
    withholds (feedbench.analysis.disclosure)."""

    summary: pd.DataFrame
    figures: dict[str, str]
    records: list[Record]
    config: dict
    inputs: dict
    disclosure: Disclosure


@dataclass(frozen=True)
class Section:
    """A section of the page, registered as the study views are: its context (what its template
    reads under the section's name), the inputs it reads (INPUTS' names) and its template (None:
    written in report.html.j2)."""

    name: str
    context: Callable[[Page], object]
    inputs: tuple[str, ...] = ()
    template: str | None = None


def experiment_sections(page: Page) -> list[dict]:
    """Each experiment's section in config order, less the derived ceiling experiments, which fold
    under the experiments they serve (the planner's map: analysis.served); with its plot, study
    view, stages, search and ceilings."""
    summary, inputs = page.summary, page.inputs
    # the ceiling cells each was predicted from
    ceilings = served.served(summary, page.config, inputs["ceilings"])
    experiments = []
    for name, spec in _experiments(summary, page.config):
        if name in served.folded(ceilings):
            continue
        svg = None
        if name in page.figures:
            with open(page.figures[name]) as f:
                svg = inline_svg(f.read())
        rows = summary[summary["experiment"] == name]
        context = experiment_context(name, spec, rows, svg)
        context["view"] = study_view(name, spec, rows, inputs["references"], inputs["target"])
        context["stages_svg"] = stages_svg(name, spec, rows)
        # what the profile of each cell's warm-up named
        context["profiled_functions"] = stages.function_rows(rows)
        _search_context(name, spec, context, rows, inputs["searches"].get(name))
        labels = {c["cell"]: c["label"] for c in context["cells"]}
        context["ceilings"] = served.measured(summary, name, ceilings.get(name, []), labels)
        experiments.append(context)
    return experiments


def prediction_section(page: Page) -> dict | None:
    """Predicted against measured, over every training cell with a prediction
    (analysis.accuracy)."""
    prediction = accuracy.report_context(page.summary)
    if prediction is not None:
        prediction["svg"] = inline_svg(prediction["svg"])
    return prediction


def _target_section(page: Page) -> dict | None:
    estimates = page.inputs["target"]
    return (
        target_in_units(target_view.build(estimates, page.records), page.summary)
        if estimates
        else None
    )


def _provenance(page: Page) -> dict:
    return provenance_table(page.records, withheld=("host",) if page.disclosure.anonymize else ())


def _counts(page: Page) -> dict:
    summary = page.summary
    return {
        "rows": len(summary),
        "ok": int((summary["status"] == "ok").sum()),
        "failed": int((summary["status"] != "ok").sum()),
        "cells": summary[["experiment", "cell"]].drop_duplicates().shape[0],
    }


SECTIONS = (
    Section(
        "experiments",
        experiment_sections,
        ("references", "searches", "ceilings", "target"),
        "experiment.html.j2",
    ),
    Section("prediction", prediction_section),
    Section("target", _target_section, ("target",)),  # "On <target>" (analysis.target_view)
    Section(
        "failures",
        lambda page: failure_rows(page.summary[page.summary["status"] != "ok"], page.records),
    ),
    Section("failure_counts", lambda page: failure_counts(page.summary)),
    Section("counts", _counts),
    Section("provenance", _provenance),
    Section("long_ids", lambda page: cut_ids(page.summary)),
)


def cell_words(summary: pd.DataFrame, config: dict) -> Callable[[str, str], str]:
    """(experiment, cell id) -> the cell in words, by its label in its experiment (a derived
    ceiling experiment's too): "cell num_workers=2", "the only cell"; a cell the summary lacks by
    its id as the tables cut it."""
    specs = (config or {}).get("experiments") or {}
    labels = {
        (experiment, cell): label
        for experiment, rows in summary.groupby("experiment", sort=False)
        for cell, label in verdict.labels_of(
            rows, (specs.get(experiment) or {}).get("matrix")
        ).items()
    }

    def named(experiment: str, cell: str) -> str:
        label = labels.get((experiment, cell))
        if label is None:
            return f"cell {short_id(cell)}"
        return "the only cell" if label == ONE_CELL else f"cell {label}"

    return named


def build(
    summary: pd.DataFrame,
    svgs: list[str],
    results: list,
    config: dict,
    config_hash: str,
    config_dir: str | None = None,
    **inputs,
) -> dict:
    """The template's context: each section of SECTIONS under its name, from the summary, the plots,
    the results' records (core.records; result files are read here, once each) and the inputs of
    INPUTS by name (references, searches, ceilings: the planner's map, target: its estimates).

    With `report: {anonymize: true}` the summary's host column is dropped before anything reads it,
    and the provenance names no host; `disclosure` then shortens every string at render time
    (feedbench.analysis.disclosure).
    """
    unknown = sorted(set(inputs) - set(INPUTS))
    if unknown:
        raise TypeError(f"report input {unknown[0]!r} is not known; allowed: {', '.join(INPUTS)}")
    disclosure = Disclosure.of(
        config, hosts=summary["host"] if "host" in summary else (), config_dir=config_dir
    )
    if disclosure.anonymize and "host" in summary:
        summary = summary.assign(host=None)
    read = {name: reader(inputs.get(name)) for name, reader in INPUTS.items()}
    page = Page(summary, _by_name(svgs), as_records(results), config, read, disclosure)
    return {
        **{section.name: section.context(page) for section in SECTIONS},
        # once for the run, ceilings included (analysis.other_load), each cell in words
        "other_load": other_load.note(summary, cell_words(summary, config)),
        "anonymized": disclosure.anonymize,
        "disclosure": disclosure,
        "config_hash": config_hash,
        "config_yaml": yaml.safe_dump(config or {}, sort_keys=False, default_flow_style=None),
        "rule": {
            "stall_pct": verdict.DATA_STALL_PCT,
            "transfer_pct": 100 * verdict.TRANSFER_SHARE,
            "other_load_pct": 100 * other_load.SHARE,
            "other_load_cores": other_load.LEAST,
            "other_load_window_s": other_load.MIN_WINDOW_S,
            "cpu_bound_share": CPU_BOUND_SHARE,
            "whatifs_shown": whatifs.SHOWN,
        },
    }


def environment(
    templates: str = TEMPLATES, disclosure: Disclosure | None = None
) -> jinja2.Environment:
    """Autoescaping, strict Jinja; every printed string goes through `disclosure` (paths shortened,
    hosts withheld)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=(disclosure or Disclosure()).finalize,
    )
    env.filters["num"] = fmt
    env.filters["short_id"] = short_id
    env.filters["breakable"] = lambda text: breakable((disclosure or Disclosure()).text(str(text)))
    env.globals["glossary_terms"] = glossary.TERMS
    return env


def render(context: dict, templates: str = TEMPLATES) -> str:
    """The page, each term's first use in each section linked to its definition
    (analysis.glossary)."""
    page = (
        environment(templates, context.get("disclosure"))
        .get_template("report.html.j2")
        .render(**context)
    )
    return glossary.link_first_uses(page)


def write_report(
    summary_csv: str,
    svgs: list[str],
    results: list,
    config: dict,
    config_hash: str,
    html: str,
    templates: str = TEMPLATES,
    verdict: str | None = None,
    config_dir: str | None = None,
    **inputs,
) -> None:
    """The report rule's work: summary + plots + the results' records (or result files, read once
    here) (+ the inputs of INPUTS by name: published tables, the choices of searches, the planner's
    map of ceilings, a target's estimates) -> one HTML file, written atomically."""
    summary = read_summary(summary_csv)
    os.makedirs(os.path.dirname(html) or ".", exist_ok=True)
    context = build(summary, svgs, results, config, config_hash, config_dir, **inputs)
    atomic_write(html, render(context, templates))
    # the rule's plain-text verdicts, which the run's end prints (the Snakefile's onsuccess)
    if verdict:
        atomic_write(verdict, verdict_text(context["experiments"], context["other_load"]))


def verdict_text(experiments: list[dict], shared: str | None = None) -> str:
    """Each experiment's three verdict lines (analysis.headline) and their why, as the report's top
    shows them, and the time its best cell, baseline or slower cells lost to the first batch or
    epoch boundaries, then the run's other load (`shared`, analysis.other_load): read in a terminal,
    on a machine with no browser."""
    blocks = []
    for e in experiments:
        if e["headline"]:
            found = e["headline"]
            lines = [f"  {word.title()}: {found[word]}" for word in ("finding", "where", "fix")]
            # why the ceilings' pick is not the fix, measured: as the page shows it under the Fix
            lines += [f"  Why: {found['why']}"] if found.get("why") else []
            # the first batch and epoch stalls, shown under the bound in the page
            lost = e["verdict"]["time_lost"]
            lines += [f"  Time lost: {lost}"] if lost else []
            blocks.append("\n".join([e["name"], *lines, *(f"  {line}" for line in e["command"])]))
        elif e["note"]:
            blocks.append(f"{e['name']}\n  {e['note']}")
    if shared:
        blocks.append(shared)
    return "\n".join(blocks) + "\n" if blocks else ""
