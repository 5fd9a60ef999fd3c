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
    lane)  timeout "${LANE_TIMEOUT:-540}" bash ci/run-lane "gpu-${VENDOR:-nvidia}" > "$OUT/lane.log" 2>&1 ;;
    fuzz)  # The long profile: FUZZ_EXAMPLES (10,000) examples per backend and op, split into FUZZ_SHARDS
           # processes with different Hypothesis seeds, all in parallel; each prints "fuzz BACKEND OP: N
           # examples, 0 failures". On the H200 the processes share about 165 examples/s in all (the GPU
           # switches between their contexts), so more shards do not finish sooner: one op per call
           # (FUZZ_OPS) fits the device tool's 600 s.
           shards=${FUZZ_SHARDS:-1} total=${FUZZ_EXAMPLES:-10000}
           pids=()
           for backend in ${FUZZ_BACKENDS:-torch triton cupy}; do
             for op in ${FUZZ_OPS:-page_table token_csr}; do
               for shard in $(seq 1 "$shards"); do
                 KVDISPATCH_FUZZ_PROFILE=long KVDISPATCH_FUZZ_EXAMPLES=$(( (total + shards - 1) / shards )) \
                   timeout "${FUZZ_TIMEOUT:-500}" python3 -m pytest -q -s -p no:cacheprovider --hypothesis-seed="$shard" \
                   tests/test_fuzz.py -k "test_${op}_matches_reference and $backend" \
                   > "$OUT/fuzz-long-$backend-$op-$shard.log" 2>&1 &
                 pids+=($!)
               done
             done
           done
           status=0
           for pid in "${pids[@]}"; do wait "$pid" || status=1; done
           grep -h "^fuzz \|passed\|failed\|Falsifying" "$OUT"/fuzz-long-*.log | sort | uniq -c
           (exit $status) ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "step $step: exit $? in $(( $(date +%s) - start )) s"
done
