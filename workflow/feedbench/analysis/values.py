"""A summary cell's value as the analysis reads it: a number or None, a non-empty text or None
(pandas writes a missing value as NaN)."""

from __future__ import annotations

import pandas as pd


def number(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def text(value) -> str | None:
    return value if isinstance(value, str) and value else None
