#!/usr/bin/env bash
# The GPU check (#35), made for a short loan of one GPU: at most 8 minutes on one H100 or H200.
#
#     bash benchmarks/gpu_check.sh [OUT]        # OUT: default gpu-check/<UTC date and time>
#     GPU_CHECK_GROUPS="pinned" bash benchmarks/gpu_check.sh OUT   # some groups of gpu_check.py only
#
# 1. every `-m gpu` test (at most 4 minutes);
# 2. benchmarks/gpu_check.py: fresh-process cells in alternating order (the two open findings, N1 to N3);
# 3. the calibration on the GPU, last, with what is left of the 8 minutes.
# Writes OUT/gpu-check.md, the table for docs/results/gpu-validation.md, and each part's log beside it.
# Without CUDA it runs dry: the GPU tests are skipped with their reasons, the cells run on the CPU at 2 steps or are
# skipped where they need CUDA, the calibration is skipped; each says so.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-gpu-check/$(date -u +%Y%m%dT%H%M)}
BUDGET_S=${GPU_CHECK_BUDGET_S:-480}
mkdir -p "$OUT"
start=$(date +%s)
left() { echo $((BUDGET_S - ($(date +%s) - start))); }
cuda=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))')

echo "gpu_check: 1/3 pytest -m gpu (log: $OUT/pytest-gpu.log)"
PYTHONPATH=workflow:tests timeout 240 "$PY" -m pytest -m gpu -n 0 -q -rs -p no:cacheprovider tests >"$OUT/pytest-gpu.log" 2>&1
echo "pytest -m gpu exit $?: $(tail -n 1 "$OUT/pytest-gpu.log")" | tee "$OUT/summary.txt"

echo "gpu_check: 2/3 cells (log: $OUT/cells.log)"
PYTHONPATH=workflow timeout "$(left)" "$PY" benchmarks/gpu_check.py --out "$OUT" ${GPU_CHECK_GROUPS:+--only $GPU_CHECK_GROUPS} >"$OUT/cells.log" 2>&1
echo "cells exit $?" | tee -a "$OUT/summary.txt"

if [ "$cuda" = 1 ] && [ "$(left)" -gt 60 ]; then
	echo "gpu_check: 3/3 calibration on the GPU, $(left) s left (log: $OUT/calibration.log)"
	PYTHONPATH=workflow:tests timeout "$(left)" "$PY" benchmarks/calibration_error.py --device cuda >"$OUT/calibration.log" 2>&1
	echo "calibration exit $?: $(tail -n 1 "$OUT/calibration.log")" | tee -a "$OUT/summary.txt"
else
	echo "calibration skipped: $([ "$cuda" = 1 ] && echo "under 60 s of the budget left" || echo "no CUDA")" | tee -a "$OUT/summary.txt"
fi
cat "$OUT/summary.txt" >>"$OUT/gpu-check.md"
echo "gpu_check: $OUT/gpu-check.md ($(($(date +%s) - start)) s)"
