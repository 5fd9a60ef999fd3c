#!/usr/bin/env bash
# Everything a GPU machine can prove in one call (the H200 through `device`, or any NVIDIA/AMD box):
# info, the full bench, the gpu lane (suite per backend, graph replay, sanitizer, bench --quick), or the
# lane's suites and memcheck as concurrent processes (suites).
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
    suites) # The lane's checks at once: the suite per forced backend, the suite with nothing forced, and memcheck
           # over the hostile set per backend, on the device's grid and on a grid of one program per
           # multiprocessor (every program then strides over its row), as concurrent processes (one GPU serves
           # them all).
           pids=()
           for b in ${BACKENDS:-torch triton cupy}; do
             KVDISPATCH_BACKEND=$b timeout "${SUITE_TIMEOUT:-540}" python3 -m pytest -q -p no:cacheprovider tests \
               > "$OUT/suite-$b.log" 2>&1 & pids+=($!)
             timeout "${SUITE_TIMEOUT:-540}" compute-sanitizer --tool memcheck --error-exitcode 1 \
               python3 ci/sanitize_hostile.py --backend "$b" > "$OUT/memcheck-$b.log" 2>&1 & pids+=($!)
             [ "$b" = torch ] || { timeout "${SUITE_TIMEOUT:-540}" compute-sanitizer --tool memcheck --error-exitcode 1 \
               python3 ci/sanitize_hostile.py --backend "$b" --programs-per-multiprocessor 1 \
               > "$OUT/memcheck-$b-strided.log" 2>&1 & pids+=($!); }
           done
           timeout "${SUITE_TIMEOUT:-540}" python3 -m pytest -q -p no:cacheprovider tests > "$OUT/suite-auto.log" 2>&1 &
           pids+=($!)
           status=0
           for pid in "${pids[@]}"; do wait "$pid" || status=1; done
           tail -n 2 "$OUT"/suite-*.log "$OUT"/memcheck-*.log
           (exit $status) ;;
    lane)  timeout "${LANE_TIMEOUT:-540}" bash ci/run-lane "gpu-${VENDOR:-nvidia}" > "$OUT/lane.log" 2>&1 ;;
    fuzz)  # The long profile: FUZZ_EXAMPLES (10,000) examples per backend and op. One process per op (and
           # per shard: FUZZ_SHARDS processes with different Hypothesis seeds share the examples) runs the
           # backends one after the other: processes on one GPU wait for each other's context at every sync
           # (six of them on the H200 ran 16-26 examples/s each). Each prints "fuzz BACKEND OP: N examples,
           # 0 failures", and "N examples so far" every 1,000.
           # First every specialisation the fuzz can reach is compiled in parallel (ci/warm_kernels.py), so
           # that the fuzz finds them in Triton's and CuPy's on-disk caches.
           shards=${FUZZ_SHARDS:-1} total=${FUZZ_EXAMPLES:-10000} backends=${FUZZ_BACKENDS:-torch triton cupy}
           compiled=$(for b in $backends; do [ "$b" = torch ] || echo "$b"; done)
           [ -z "$compiled" ] || python3 ci/warm_kernels.py --backends $compiled \
             --ops ${FUZZ_OPS:-page_table token_csr} | tee "$OUT/fuzz-warm.log"
           selected=$(echo "$backends" | sed 's/ \+/ or /g')
           pids=()
           for op in ${FUZZ_OPS:-page_table token_csr}; do
             for shard in $(seq 1 "$shards"); do
               KVDISPATCH_FUZZ_PROFILE=long KVDISPATCH_FUZZ_EXAMPLES=$(( (total + shards - 1) / shards )) \
                 timeout "${FUZZ_TIMEOUT:-500}" python3 -m pytest -q -s -p no:cacheprovider --hypothesis-seed="$shard" \
                 tests/test_fuzz.py -k "test_${op}_matches_reference and ($selected)" \
                 > "$OUT/fuzz-long-$op-$shard.log" 2>&1 &
               pids+=($!)
             done
           done
           status=0
           for pid in "${pids[@]}"; do wait "$pid" || status=1; done
           for log in "$OUT"/fuzz-long-*.log; do  # a timed-out run shows how far it got
             echo "$(basename "$log"):"
             grep "^fuzz .*failures\|passed\|failed\|Falsifying" "$log" || echo "  last: $(grep "^fuzz " "$log" | tail -1)"
           done
           (exit $status) ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "step $step: exit $? in $(( $(date +%s) - start )) s"
done
