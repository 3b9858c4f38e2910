# feedbench: is my GPU starved by its input pipeline, and which knobs fix it?
# Layout and data flow: README.md. The config is validated against
# config/schema.yaml and expanded into cells before any job starts.

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        "results/report/index.html",
