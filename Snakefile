# feedbench: is my GPU starved by its input pipeline, and which knobs fix it?
# Layout and data flow: README.md. The config is validated against
# config/schema.yaml and expanded into cells before any job starts.

from snakemake.utils import min_version

min_version("9.0")


# The default matrix, unless configfiles are given (`--configfile
# config/presets/nmt.yaml`): then they alone are the config, so a preset never
# inherits the default experiments. `--config key=value` merges over whichever
# it is. Jobs get the same configfiles, so they see the same config.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        "results/report/index.html",
