#!/usr/bin/env bash
# Wall time of `run` over a directory of files with --jobs 1 and --jobs 4 (issue 18): 40
# files of `print(1)`, and 40 of the seed's numpy example. One run of each, in one go, so the
# ratios compare like with like; run it on a quiet machine with a release build:
#
#   cargo build --release && scripts/bench-run-jobs.sh [BINARY] [FILES]
#
# The goal: --jobs 4 takes at most 0.35x the wall time of --jobs 1, for both sets. A last row
# gives Docker's own ceiling in the same run: the same 40 `print(1)` as plain
# `docker run --rm` of the sandbox image (no hardening, no runner), one at a time and 4 at
# once (needs the docker CLI; skipped without it).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-${CARGO_TARGET_DIR:-target}/release/mcp-code-executor}
n=${2:-40}
[ -x "$bin" ] || { echo "bench-run-jobs: no binary at $bin (cargo build --release)" >&2; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/print" "$dir/numpy"
for i in $(seq -w 1 "$n"); do
  echo 'print(1)' >"$dir/print/p$i.py"
  echo 'import numpy as np; print(np.random.rand(3,3))' >"$dir/numpy/n$i.py"
done
"$bin" image build >/dev/null 2>&1 || true

# Wall seconds of one `run`, which must pass.
wall() {
  local start end
  start=$(date +%s.%N)
  if ! "$bin" run "$@" >/dev/null 2>"$dir/stderr"; then
    cat "$dir/stderr" >&2
    echo "bench-run-jobs: run $* failed" >&2
    exit 1
  fi
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }'
}

printf '%-8s %6s %12s %12s %8s\n' set files 'jobs 1 (s)' 'jobs 4 (s)' ratio
for set in print numpy; do
  one=$(wall --jobs 1 "$dir/$set")
  four=$(wall --jobs 4 "$dir/$set")
  ratio=$(awk -v a="$one" -v b="$four" 'BEGIN { printf "%.2f", b / a }')
  printf '%-8s %6s %12s %12s %8s\n' "$set" "$n" "$one" "$four" "$ratio"
done

if command -v docker >/dev/null; then
  image=$("$bin" image name)
  drun() {
    docker run --rm --network none --label io.mcp-code-executor.bench-run-jobs=1 "$image" \
      python3 -c 'print(1)' >/dev/null
  }
  export -f drun
  export image
  start=$(date +%s.%N)
  for _ in $(seq "$n"); do drun; done
  one=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
  start=$(date +%s.%N)
  seq "$n" | xargs -P 4 -I{} bash -c drun
  four=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
  ratio=$(awk -v a="$one" -v b="$four" 'BEGIN { printf "%.2f", b / a }')
  printf '%-8s %6s %12s %12s %8s\n' "docker" "$n" "$one" "$four" "$ratio"
fi
