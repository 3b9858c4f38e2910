"""The tests' helpers, in one place: imported as `helpers.<module>` (pytest puts tests/ on the
path)."""
