#!/usr/bin/env bash
# A patch timed against the tree it applies to, in one device call: `kvdispatch bench` of the tree, of the
# patched tree, then both again (interleaved rounds), each round's table and a log line in OUT_DIR.
# Usage, from the repository root: bash benchmarks/patch_ab.sh PATCH BACKENDS CASES [OUT_DIR]
# e.g. bash benchmarks/patch_ab.sh benchmarks/draft_window_tile.patch triton,cupy draft_decode:64x4096x5x4:w256
set -uo pipefail
if [ $# -lt 3 ]; then
  sed -n '2,5p' "$0"
  exit 2
fi
patch_file=$1 backends=$2 cases=$3 out=${4:-${OUT:-/tmp/patch_ab}}
export PYTHONPATH=.
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/runs.txt" 2>&1

bench() {  # round, label
  local start=$SECONDS
  timeout 150 python3 -m kvdispatch bench --backends "$backends" --cases "$cases" --markdown > "$out/$1-$2.md" 2>&1
  echo "round $1 $2: rc=$? $((SECONDS - start)) s" >> "$out/runs.txt"
}

for round in 1 2; do
  bench "$round" base
  patch -p1 -s --dry-run < "$patch_file" && patch -p1 -s < "$patch_file" || { echo "the patch does not apply" >> "$out/runs.txt"; exit 1; }
  bench "$round" patched
  patch -p1 -R -s < "$patch_file"
done
cat "$out/runs.txt"
