#!/usr/bin/env bash
# The GPU check (#35, #50): the first command on a GPU lent for a few minutes, at most 8 minutes on
# one H100 or H200, start-up included. It runs on the machine's own Python: PyTorch, torchvision,
# numpy and pandas, plus benchmarks/gpu_check_requirements.txt (pytest, psutil, PyYAML, jsonschema);
# no Snakemake, no Slurm plugin, no yte.
#
#     bash benchmarks/gpu_check.sh [OUT]          # OUT: default gpu-check/<UTC date and time>
#     GPU_CHECK_BUDGET_S=300 bash benchmarks/gpu_check.sh OUT
#     PYTHON=python3.12 bash benchmarks/gpu_check.sh OUT
#
# The parts, their budgets and the table: benchmarks/gpu_check.py. Every finished row is kept in
# OUT/gpu-check.md as it is measured. Without CUDA it runs dry, each part saying so.
set -uo pipefail
cd "$(dirname "$0")/.."
# The files that hold the tests marked gpu, and none other: pytest collects only these, so a module
# the machine cannot import (one that needs Snakemake) costs nothing. tests/workflow/test_benchmarks.py
# fails while a file with a gpu test is missing here.
GPU_TESTS="tests/analysis/test_predict.py tests/harness/test_decoder.py tests/harness/test_device_prep.py
tests/harness/test_gpu.py tests/harness/test_gpu_paths.py tests/harness/test_own_pipeline_copies.py
tests/harness/test_prefetch.py tests/harness/test_command.py tests/harness/test_what_pytorch_takes.py"
if [ -n "${PYTHON:-}" ]; then
	PY=$PYTHON
elif [ -x .venv/bin/python ]; then
	PY=.venv/bin/python
else
	PY=python3 # a bare GPU machine: its own Python
fi
OUT=${1:-gpu-check/$(date -u +%Y%m%dT%H%M)}
# shellcheck disable=SC2086  # the file list splits into its files
exec "$PY" benchmarks/gpu_check.py --out "$OUT" --budget "${GPU_CHECK_BUDGET_S:-480}" --gpu-tests $GPU_TESTS
