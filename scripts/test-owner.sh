#!/usr/bin/env bash
# Tell the containers a test run made from everyone else's, for scripts/test.sh.
#
# Every sandbox carries the label io.mcp-code-executor.owner=HOST/PID/START of the process
# that made it, HOST being that process's host name (src/backend/labels.rs). scripts/test.sh
# runs the tests in a UTS namespace of their own whose host name names the run
# (`name`, below): then everything a test process makes, or a server a test starts, carries
# that host name in its owner label, and nothing else on the daemon does: not a `serve` the
# developer left running (owner: the real host name), not another run's tests. The check
# at the end (`check`) looks at those containers only, and removes only them.
#
# A run killed halfway leaves its sandboxes behind under its own host name: they stop by
# themselves (a runner's backstop deadline, a pool sandbox's limit on waiting for a job),
# and any server's start-up sweep removes ended ones after an hour, whoever made them.
#
#   scripts/test-owner.sh name [PID]          the host name of the run of process PID (default: the caller)
#   scripts/test-owner.sh enter NAME CMD...   run CMD in a new UTS namespace whose host name is NAME
#   scripts/test-owner.sh check NAME          containers of ours made under NAME: listed and
#                                             removed (exit 1), or none (exit 0); nothing else
#                                             on the daemon is touched
set -euo pipefail

LABEL_MANAGED=io.mcp-code-executor.managed
LABEL_OWNER=io.mcp-code-executor.owner

# Field 22 of /proc/PID/stat: the start time (after the parenthesised command name).
start_time() {
  local stat
  stat=$(cat "/proc/$1/stat")
  stat=${stat##*) }
  set -- $stat
  echo "${20}"
}

case "${1:-}" in
  name)
    # The run's process (scripts/test.sh) by pid and start time: unique on this host, and
    # a host name (letters, digits, hyphens; at most 63 characters).
    pid=${2:-$PPID}
    host=$(tr -d '\n' </proc/sys/kernel/hostname | tr -c 'A-Za-z0-9-' - | head -c 20)
    echo "${host:-host}-test-$pid-$(start_time "$pid")"
    ;;
  enter)
    [ $# -ge 3 ] || { echo "usage: $0 enter NAME CMD..." >&2; exit 2; }
    name=$2
    shift 2
    outer=$(readlink /proc/self/ns/uts)
    # As root; else in a user namespace (the Docker socket is still reached as the caller).
    if unshare --uts true 2>/dev/null; then
      exec unshare --uts -- "$0" in-namespace "$outer" "$name" "$@"
    elif unshare --user --map-root-user --uts true 2>/dev/null; then
      exec unshare --user --map-root-user --uts -- "$0" in-namespace "$outer" "$name" "$@"
    fi
    echo "test-owner.sh: cannot make a UTS namespace (unshare --uts needs root or user namespaces):" \
      "the tests' containers could not be told apart from other servers'" >&2
    exit 1
    ;;
  in-namespace)
    outer=$2
    name=$3
    shift 3
    # Never rename the machine: only inside a namespace other than the caller's.
    if [ "$(readlink /proc/self/ns/uts)" = "$outer" ]; then
      echo "test-owner.sh: not in a new UTS namespace; the host name is left alone" >&2
      exit 1
    fi
    echo "$name" >/proc/sys/kernel/hostname
    exec "$@"
    ;;
  check)
    [ $# -eq 2 ] || { echo "usage: $0 check NAME" >&2; exit 2; }
    name=$2
    mine=()
    others=0
    while read -r id owner; do
      [ -n "$id" ] || continue
      case "$owner" in
        "$name"/*) mine+=("$id") ;;
        *) others=$((others + 1)) ;;
      esac
    done < <(docker ps -a --filter "label=$LABEL_MANAGED=true" \
      --format "{{.ID}} {{.Label \"$LABEL_OWNER\"}}")
    if [ "${#mine[@]}" -gt 0 ]; then
      echo "test-owner.sh: containers left behind by this run's tests (owner $name/...):" >&2
      docker ps -a --filter "label=$LABEL_MANAGED=true" \
        --format "{{.ID}} {{.Names}} {{.Status}} tenant={{.Label \"io.mcp-code-executor.tenant\"}} owner={{.Label \"$LABEL_OWNER\"}}" \
        | grep -F " owner=$name/" >&2 || true
      docker rm -f -v "${mine[@]}" >/dev/null
      echo "test-owner.sh: removed those ${#mine[@]}; $others other container(s) of ours on this daemon (other servers, other runs) not touched" >&2
      exit 1
    fi
    echo "test-owner.sh: no container made by this run's tests is left (owner $name/...); $others other container(s) of ours on this daemon (other servers, other runs) not looked at" >&2
    ;;
  *)
    echo "usage: $0 name | enter NAME CMD... | check NAME" >&2
    exit 2
    ;;
esac
