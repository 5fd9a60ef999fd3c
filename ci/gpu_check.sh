#!/usr/bin/env bash
# Everything a GPU machine can prove in one call (the H200 through `device`, or any NVIDIA/AMD box):
# info, the full bench, the gpu lane (suite per backend, graph replay, sanitizer, bench --quick).
# Logs and results go to $OUT (default .out/). Usage: bash ci/gpu_check.sh [steps...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-.out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
steps=${*:-info bench lane}
for step in $steps; do
  start=$(date +%s)
  case $step in
    info)  { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv || rocm-smi; \
             python3 -m kvdispatch info; } > "$OUT/info.txt" 2>&1 ;;
    bench) timeout "${BENCH_TIMEOUT:-300}" python3 -m kvdispatch bench --json "$OUT/bench.json" --markdown \
             --plot "$OUT/bench.png" > "$OUT/bench.md" 2> "$OUT/bench.err" ;;
    quick) timeout 120 python3 -m kvdispatch bench --quick > "$OUT/bench-quick.txt" 2>&1 ;;
    lane)  timeout "${LANE_TIMEOUT:-420}" bash ci/run-lane "gpu-${VENDOR:-nvidia}" > "$OUT/lane.log" 2>&1 ;;
    fuzz)  KVDISPATCH_FUZZ_PROFILE=long timeout "${FUZZ_TIMEOUT:-400}" python3 -m pytest -q tests/test_fuzz.py \
             > "$OUT/fuzz-long.log" 2>&1 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "step $step: exit $? in $(( $(date +%s) - start )) s"
done
