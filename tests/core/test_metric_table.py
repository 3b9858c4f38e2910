"""The metric table (feedbench.core.metric_table) against the code that measures and the schema that
states results.

A metric is declared once: these fail while a declared metric is written by no module of the
package, while the result schema's file states a metric otherwise than the table, or while the
summary of a result written before a metric existed reads otherwise than the table says (empty).
tests/harness/test_scenarios.py fails while a cell's result holds a metric the table does not
declare (metric_table.undeclared); tests/workflow/test_docs.py while the table in
docs/result-schema.md is stale.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import jsonschema
import pytest
from conftest import ROOT
from feedbench.core import metric_table
from feedbench.core.columns import METRIC_COLUMNS
from feedbench.core.metric_table import METRICS, PHASE, row_of, schema_node
from feedbench.core.metrics import PHASES
from feedbench.core.result import schema, schema_file

PACKAGE = Path(ROOT) / "workflow" / "feedbench"
# Modules that name metrics without writing them.
NOT_WRITERS = {"core/metric_table.py", "core/columns.py"}


def _keys(path: Path) -> list[re.Pattern]:
    """The keys a module may write, as patterns: its strings, keyword arguments
    (`update(duration_s=...)`), a string and one word added, and f-strings with some literal text
    (`f"p{q}"`, each replacement field one word: `p50`, not `peak_gb_per_s`)."""
    keys = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            keys.append(re.escape(node.value))
        elif isinstance(node, ast.keyword) and node.arg:
            keys.append(re.escape(node.arg))
        elif (
            isinstance(node, ast.BinOp)
            and isinstance(node.left, ast.Constant)
            and isinstance(node.left.value, str)
        ):
            keys.append(re.escape(node.left.value) + "[^_]+")  # "peak_gb_per_s_" + kind
        elif isinstance(node, ast.JoinedStr) and any(
            isinstance(v, ast.Constant) for v in node.values
        ):
            keys.append(
                "".join(
                    re.escape(v.value) if isinstance(v, ast.Constant) else "[^_]+"
                    for v in node.values
                )
            )
    return [re.compile(k) for k in keys]


WRITTEN = [
    key
    for path in PACKAGE.rglob("*.py")
    if path.relative_to(PACKAGE).as_posix() not in NOT_WRITERS
    for key in _keys(path)
]


@pytest.mark.parametrize("name", METRICS)
def test_every_declared_metric_is_written_by_the_package(name):
    """Its key at the end of its path is a string of some module outside the table: the harness, or
    the plan's measures it calls (core.metrics.summarize). A metric declared and never measured
    fails here."""
    key = METRICS[name].parts[-1]
    assert any(written.fullmatch(key) for written in WRITTEN), (
        f"metric {name!r}: no module of the package writes {key!r} ({METRICS[name].path})"
    )


def _file_leaf(metric) -> dict | None:
    file = schema_file()
    node = file
    for part in metric.parts:
        node = schema_node(file, node, part) if node is not None else None
    return node


@pytest.mark.parametrize("name", METRICS)
def test_the_schema_file_states_a_metric_as_the_table_does(name):
    """Where the file states a metric's leaf (an older one: a new metric's comes from the table
    alone), its type, nullability and bounds are the table's."""
    metric, leaf = METRICS[name], _file_leaf(METRICS[name])
    if leaf is None:
        return
    types = leaf.get(
        "type", sorted({"null" if v is None else "string" for v in leaf.get("enum", [])})
    )
    types = [types] if isinstance(types, str) else types
    assert (sorted(types), leaf.get("minimum"), leaf.get("maximum")) == (
        sorted(metric_table.leaf_schema(metric)["type"]),
        metric.minimum,
        metric.maximum,
    )


def test_the_schema_takes_each_metric_from_the_table():
    """A leaf the file leaves out comes from the table, and the phases a result may hold are
    PHASES."""
    full = schema()
    monitor_stats = full["properties"]["monitor"]["properties"]["stats"]["additionalProperties"]
    assert monitor_stats["properties"]["mean"]["type"] == ["number", "null"]
    assert full["properties"]["metrics"]["properties"]["phases"]["propertyNames"] == {
        "enum": list(PHASES)
    }
    metrics = full["properties"]["metrics"]
    jsonschema.validate(
        {"phases": {"wait": {"median_ms": 1.0, "mean_ms": 1.0, "share": 0.5}}}, metrics
    )
    with pytest.raises(jsonschema.ValidationError, match="101 is greater than the maximum of 100"):
        jsonschema.validate({"stall_pct": 101}, metrics)
    with pytest.raises(jsonschema.ValidationError, match="'slow' is not one of"):
        jsonschema.validate(
            {"phases": {"slow": {"median_ms": 1.0, "mean_ms": 1.0, "share": 0.5}}}, metrics
        )


def test_a_result_from_before_a_metric_reads_empty():
    """A result without a figure (written before it existed) has its column empty; a phase's columns
    are in every row, a stage's, a probed size's and a sparse metric's only where the result holds
    them."""
    row = row_of(
        {"metrics": {"samples_per_s": 10.0, "phases": {"wait": {"median_ms": 2.0, "share": 0.25}}}}
    )
    assert list(row) == METRIC_COLUMNS
    assert row["samples_per_s"] == 10.0 and row["wait_ms"] == 2.0 and row["wait_share"] == 0.25
    assert (
        row["time_to_first_batch_s"] is None
        and row["h2d_ms"] is None
        and row["stage_order"] is None
    )
    assert all(f"{phase}_ms" in row for phase in PHASES) and not any(
        c.startswith("transfer_") for c in row
    )


def test_expansions_and_conversions_flatten_as_declared():
    result = {
        "metrics": {
            "stages": {
                "order": ["read", "decode"],
                "stages": {"decode": {"median_ms": 3.0, "calls": 7}},
            },
            "whatif": {"trades": [], "cache": {"bytes": 3 * 2**20}},
            "transfer": {
                "method": "copy",
                "by_size": [{"size_bytes": 64, "pinned": True, "median_gb_per_s": 2.5}],
            },
        },
        "monitor": {"stats": {"host_cpu_pct": {"mean": 50.0, "max": 90.0}}},
    }
    row = row_of(result)
    assert (
        row["stage_order"] == "read > decode"
        and row["whatif_trades"] is None
        and row["whatif_cache_mb"] == 3.0
    )
    assert (
        row["stage_decode_ms"] == 3.0
        and row["stage_decode_calls"] == 7
        and math.isnan(row["stage_decode_share"] or math.nan)
    )
    assert row["transfer_method"] == "copy" and row["transfer_gb_per_s_pinned_64"] == 2.5
    assert row["host_cpu_pct_mean"] == 50.0


def test_phase_columns_follow_the_phases():
    """Each phase of PHASES gives its columns, in the order of a step: a new phase needs no edit
    here."""
    phase_columns = [
        c
        for c in METRIC_COLUMNS
        if any(c == m.column.format(phase=p) for p in PHASES for m in metric_table.expanded(PHASE))
    ]
    assert phase_columns == [
        m.column.format(phase=p) for p in PHASES for m in metric_table.expanded(PHASE)
    ]
