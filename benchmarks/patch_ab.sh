#!/usr/bin/env bash
# Patches timed against the tree they apply to, in one device call: `kvdispatch bench` of the tree, then of the
# tree with each patch in turn, then all again (interleaved rounds). Every round's table goes into
# OUT_DIR/bench.tgz (one file, as the device returns a few), a line per round into OUT_DIR/runs.txt.
# Usage, from the repository root (OUT_DIR: $OUT, else /tmp/patch_ab):
#   bash benchmarks/patch_ab.sh BACKENDS CASES PATCH [PATCH...]
# e.g. bash benchmarks/patch_ab.sh triton,cupy draft_decode:64x4096x5x4:w256 benchmarks/draft_window_tile.patch
set -uo pipefail
if [ $# -lt 3 ]; then
  sed -n '2,7p' "$0"
  exit 2
fi
backends=$1 cases=$2
shift 2
out=${OUT:-/tmp/patch_ab} tables=$(mktemp -d)
export PYTHONPATH=.
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/runs.txt" 2>&1

bench() {  # round, label
  local start=$SECONDS
  timeout 150 python3 -m kvdispatch bench --backends "$backends" --cases "$cases" --markdown > "$tables/$1-$2.md" 2>&1
  echo "round $1 $2: rc=$? $((SECONDS - start)) s" >> "$out/runs.txt"
  tar czf "$out/bench.tgz" -C "$tables" .
}

for round in 1 2; do
  bench "$round" base
  for patch_file in "$@"; do
    if ! patch -p1 -s --dry-run < "$patch_file" > /dev/null; then
      echo "$patch_file does not apply" >> "$out/runs.txt"
      continue
    fi
    patch -p1 -s < "$patch_file"
    bench "$round" "$(basename "$patch_file" .patch)"
    patch -p1 -R -s < "$patch_file"
  done
done
cat "$out/runs.txt"
