"""A result.json spoilt in the ways issue #9 found (tests/workflow/test_damaged_results.py,
tests/analysis/test_aggregate.py)."""

import json


def damage(text: str, how: str) -> str:
    """The ways issue #9 found a result.json spoilt; each must count as failed and be rerun."""
    if how == "truncated":
        return text[: len(text) // 2]
    if how == "junk":
        return "<html>502 Bad Gateway</html>\n"
    if how in ("null", "list"):
        return {"null": "null\n", "list": "[1, 2]\n"}[how]
    result = json.loads(text)
    if how == "no-metrics":
        del result["metrics"]
    elif how == "rate-is-text":
        result["metrics"]["samples_per_s"] = "fast"
    elif how == "negative-stall":
        result["metrics"]["stall_pct"] = -50
    elif how == "nan-step":
        result["metrics"]["step_ms"]["median"] = float("nan")
    return json.dumps(result)
