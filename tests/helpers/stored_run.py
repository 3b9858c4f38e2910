"""The default run's report, rendered by today's code from the run stored in
tests/stored/default-run (its README)."""

from __future__ import annotations

import os

import yaml
from feedbench.analysis import publish

DEFAULT_RUN = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "stored", "default-run"
)
# the run's, as its report showed it
CONFIG_HASH = "2f19b81d778544b873ab7f732d51074030d0ddc014684c719918e7b72de05aa4"


def default_config() -> dict:
    with open(os.path.join(DEFAULT_RUN, "config.yaml")) as f:
        return yaml.safe_load(f)


def render_default_run(out: str) -> str:
    """Plots and report of the stored default run under `out`, as the workflow's rules make them;
    the report's path."""
    config, summary = default_config(), os.path.join(DEFAULT_RUN, "summary.csv")
    svgs = []
    for name, spec in config["experiments"].items():
        svgs.append(os.path.join(out, "plots", f"{name}.svg"))
        publish.plot(summary, name, spec, svgs[-1])
    html = os.path.join(out, "report", "index.html")
    publish.report(
        summary,
        svgs,
        [],
        config,
        CONFIG_HASH,
        html,
        ceilings=os.path.join(DEFAULT_RUN, "ceilings.json"),
    )
    return html
