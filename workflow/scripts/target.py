"""Snakemake `script:` of rule target: every single-process training cell estimated on the config's
`target:` GPU -> results/target.json (feedbench.harness.flops.target_estimates): the FLOPs and bytes
counted here on the CPU, the compute seconds on the target with the efficiency used (or measured
there, with `compute: measured`), the copy's seconds over its link, and the published error."""

import sys

from feedbench.harness.flops import write_target_estimates

snakemake = globals()["snakemake"]  # injected by Snakemake
# warnings and tracebacks go to the rule's log
sys.stderr = open(snakemake.log[0], "w", buffering=1)

write_target_estimates(
    snakemake.output.estimates,
    dict(snakemake.params.cells),
    dict(snakemake.params.target),
    snakemake.params.root,
    dict(snakemake.params.measured),
    list(snakemake.input.measured),
)
