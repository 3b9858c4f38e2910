"""`search: num_workers` through a real Snakemake run: a 16-level worker axis measures its ceilings,
the checkpoint picks the knee, and only the cells around it train (feedbench.core.search;
workflow/rules/search.smk)."""

from __future__ import annotations

import json
import re

import pytest
from helpers.browser import paragraph_texts
from helpers.cells import tiny_mlp_base
from helpers.snakemake_run import snakemake, workflow_copy

pytestmark = pytest.mark.slow  # 21 tiny cells, one at a time on 2 cores: about three minutes

SIXTEEN = list(range(16))
CONFIG = {
    "defaults": {
        "repeats": 1,
        "steps": 4,
        "warmup_steps": 1,
        "device": "cpu",
        "torch_threads": 1,
        "monitor_interval_s": 0.05,
    },
    "experiments": {
        "knee": {
            "title": "How many workers does a slow loader need?",
            "search": "num_workers",
            "base": tiny_mlp_base(num_samples=64, sample_delay_ms=2),
            "matrix": {"num_workers": SIXTEEN},
        }
    },
}


def bench_jobs(output: str) -> list[str]:
    """experiment/cell of every bench job in Snakemake's output (a dry run's plan, or a run's
    log)."""
    return re.findall(r"output: results/cells/(\S+)/rep\d+/result\.json", output)


def test_a_16_level_worker_axis_trains_at_most_4_cells(tmp_path):
    workflow, work = workflow_copy(tmp_path)

    # Before the ceilings exist, a dry run plans the ceilings alone and says in one line what the
    # checkpoint decides.
    dry = snakemake(workflow, work, CONFIG, "--dry-run")
    assert dry.returncode == 0, dry.stderr + dry.stdout
    planned = bench_jobs(dry.stdout)
    # 16 loader + 1 compute
    assert len(planned) == 17 and not [p for p in planned if p.startswith("knee/")]
    (line,) = [
        line for line in dry.stdout.splitlines() if "search knee: after the ceilings" in line
    ]
    assert (
        "16 levels" in line
        and "at most 4 training cells" in line
        and "results/search/knee.json" in line
    )

    # The ceilings and the checkpoint only: then a dry run shows exactly the training cells it
    # chose.
    ceilings = snakemake(workflow, work, CONFIG, "results/search/knee.json")
    assert ceilings.returncode == 0, ceilings.stderr + ceilings.stdout
    plan = json.loads((work / "results/search/knee.json").read_text())
    assert plan["levels"] == SIXTEEN and plan["run"][0] == "num_workers-0"
    (group,) = plan["groups"]
    assert group["knee"] in group["levels"] and len(group["levels"]) <= 3
    assert all(p["samples_per_s"] > 0 for p in group["predicted"])
    after = snakemake(workflow, work, CONFIG, "--dry-run")
    assert after.returncode == 0, after.stderr + after.stdout
    assert sorted(bench_jobs(after.stdout)) == sorted(f"knee/{cell}" for cell in plan["run"])
    assert "search knee: after the ceilings" not in after.stdout

    # The run trains those cells and no other; the report cites the search.
    run = snakemake(workflow, work, CONFIG)
    assert run.returncode == 0, run.stderr + run.stdout
    trained = sorted(
        p.parent.parent.name for p in (work / "results/cells/knee").glob("*/rep1/result.json")
    )
    assert trained == sorted(plan["run"]) and 2 <= len(trained) <= 4
    html = (work / "results/report/index.html").read_text()
    assert f"searched: 16 levels of num_workers, ran {len(group['levels'])}: " in html
    # The worker count with its proof (analysis.knee): measured at the knee and its neighbours,
    # against the limits.
    (proof,) = paragraph_texts(html, "search worker-count")[:1]
    count = int(re.match(r"recommended: (\d+) workers?\. Measured there: ", proof).group(1))
    assert (
        count in group["levels"]
        and "% of the compute ceiling (" in proof
        and "(one repeat: no interval)" in proof
    )
    assert "MB of shared memory in flight of " in proof, proof
    # They sleep 2 ms a sample, so they wait, unless other load keeps them in the run queue; a
    # loaded machine may also starve the monitor of its samples in these 0.1 s cells (the kind then
    # says so).
    kinds = (
        # the runnable share follows either (analysis.knee)
        r"are (waiting|CPU-bound)(, runnable \d+ % of the time)?"
        r"|were not sampled \(a run shorter than monitor_interval_s\)"
    )
    assert re.search(rf"its workers ({kinds}), \d+ cores asked of \d+ usable", proof), proof
    assert re.search(
        r"the neighbours measured: (none below|\d+ workers? [\d.,]+ samples/s " r"\(\d+ %\)), ",
        proof,
    ), proof
    assert "Further workers are stopped by " in proof and proof.endswith(".")
