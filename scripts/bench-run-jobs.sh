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
  "$bin" run "$@" >/dev/null 2>"$dir/stderr" &
  echo "$!" >"$dir/pid"
  if ! wait "$!"; then
    cat "$dir/stderr" >&2
    echo "bench-run-jobs: run $* failed" >&2
    exit 1
  fi
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }'
}

image=$("$bin" image name)
export image
if [ "${ONLY:-}" != xargs ]; then  # ONLY=xargs: just the last comparison
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
fi

# Issue 29: `run --jobs 4` against the hand-written loop a CI user would write instead,
# `xargs -P4 docker run --rm -i` of the same files with the same hardening (memory, pids,
# CPU, read-only root, no network, no capabilities, non-root, as `docker_run_flags`
# gives them for the default limits). ROUNDS rounds (default 3), the two alternating;
# medians. Goal: run / xargs <= 0.9.
if command -v docker >/dev/null; then
  rounds=${ROUNDS:-3}
  hard=(--user 65534:65534 --network none --cap-drop ALL --security-opt no-new-privileges
    --read-only --tmpfs /workspace:rw,nosuid,nodev,noexec,size=67108864,mode=1777
    --tmpfs /tmp:rw,nosuid,nodev,noexec,size=67108864,mode=1777 --pids-limit 128
    --memory 536870912 --memory-swap 536870912 --cpus 1 --ulimit nofile=1024:1024
    --shm-size 16777216 --log-driver none --label io.mcp-code-executor.bench-run-jobs=1)
  export HARD="${hard[*]}"
  hrun_x() { local -a h; read -ra h <<<"$HARD"; docker run --rm -i "${h[@]}" "$image" python3 - <"$1" >/dev/null; }
  export -f hrun_x
  # Where the time goes, from the daemon's own event log of each side's containers:
  # containers made, and medians of create->start, start->die, die->destroy (ms).
  phases() {
    python3 - "$1" "${2:-}" <<'PY'
import json, statistics, sys
seen = {}
for line in open(sys.argv[1]):
    e = json.loads(line)
    attrs = e.get("Actor", {}).get("Attributes", {})
    owner = attrs.get("io.mcp-code-executor.owner", "")
    if sys.argv[2] and owner.split("/")[1:2] != [sys.argv[2]]:
        continue  # not made by the `run` measured
    if not sys.argv[2] and "io.mcp-code-executor.bench-run-jobs" not in attrs:
        continue
    seen.setdefault(e["id"], {}).setdefault(e["Action"].split(":")[0], e["timeNano"] / 1e9)
def med(a, b):
    x = [v[b] - v[a] for v in seen.values() if a in v and b in v]
    return "%.0f" % (statistics.median(x) * 1000) if x else "-"
kills = sum(1 for v in seen.values() if "kill" in v)
print("%d containers (%d killed); ms create->start %s, start->die %s, die->destroy %s"
      % (len(seen), kills, med("create", "start"), med("start", "die"), med("die", "destroy")))
PY
  }
  # The daemon's events of one side, while "$@" runs: printed as phases.
  # (`run`'s own containers: those whose owner label names its pid; the loop's: its label.)
  traced() {
    local ev=$dir/events side=$1
    shift
    rm -f "$dir/pid"
    docker events --format '{{json .}}' --filter type=container >"$ev" &
    local pid=$!
    "$@"
    sleep 1
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
    local who=
    [ "$side" = run ] && who=$(cat "$dir/pid")
    if [ -s "$ev" ]; then printf '  %s: ' "$side" >&2; phases "$ev" "$who" >&2; fi
  }
  # Wall seconds of the hand-written loop.
  loop_wall() {
    local start
    start=$(date +%s.%N)
    ls "$dir"/print/*.py | xargs -P 4 -I{} bash -c 'hrun_x {}'
    awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'
  }
  runs=() loops=()
  for r in $(seq "$rounds"); do
    traced run wall --jobs 4 "$dir/print" >"$dir/wall"
    runs+=("$(cat "$dir/wall")")
    traced xargs loop_wall >"$dir/wall"
    loops+=("$(cat "$dir/wall")")
    echo "round $r: run --jobs 4 ${runs[-1]} s, xargs -P4 docker run --rm -i ${loops[-1]} s (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  done
  med() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
  a=$(med "${runs[@]}") b=$(med "${loops[@]}")
  printf '\n%s rounds, medians: run --jobs 4 %s s, xargs -P4 docker run --rm -i (hardened) %s s, ratio %s\n' \
    "$rounds" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a / b }')"
fi

