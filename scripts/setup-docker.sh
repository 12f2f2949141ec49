#!/usr/bin/env bash
# Make sure a Docker daemon answers on this machine: install docker.io, debootstrap (for
# the offline base image) and docker-compose (the deployment and its test) when missing, and start dockerd when `docker info`
# fails. Idempotent; needs root only when something is missing.
#
# --gvisor: also make gVisor's runtime `runsc` available to the daemon (the `--runtime runsc`
# isolation tier): install Debian's `runsc` package when missing, register it in
# /etc/docker/daemon.json with the flags this kind of host needs (`--platform=ptrace`: no
# virtualisation exposed to the machine, so no KVM platform; `--network=none`: sandboxes
# have no network, and a `--network none` container does not start under runsc without
# it), and make a running dockerd reload its configuration with SIGHUP (never a restart:
# running containers are left alone). Idempotent: nothing is written or signalled when the
# registration is already there.
set -euo pipefail

gvisor=0
for arg in "$@"; do
  case "$arg" in
    --gvisor) gvisor=1 ;;
    -h | --help)
      sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "setup-docker: unknown argument $arg (known: --gvisor)" >&2
      exit 2
      ;;
  esac
done

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v docker >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
if [ "$gvisor" = 1 ] && ! command -v runsc >/dev/null 2>&1; then need+=(runsc); fi
if ((${#need[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "setup-docker: ${need[*]} missing and not root: install them (apt-get install ${need[*]})" >&2
    exit 1
  fi
  echo "setup-docker: installing ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The runtime entry the gVisor tier needs. Written before dockerd starts (a fresh machine)
# or followed by SIGHUP (a running daemon re-reads `runtimes` on reload).
RUNSC_ARGS='["--platform=ptrace", "--network=none"]'
register_runsc() {
  local conf=/etc/docker/daemon.json runsc
  runsc=$(command -v runsc)
  python3 - "$conf" "$runsc" "$RUNSC_ARGS" <<'PY'
import json, os, sys
conf, path, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    with open(conf) as f:
        text = f.read()
    cfg = json.loads(text) if text.strip() else {}
except FileNotFoundError:
    cfg = {}
want = {"path": path, "runtimeArgs": args}
if cfg.get("runtimes", {}).get("runsc") == want:
    sys.exit(3)  # already registered: nothing to do
cfg.setdefault("runtimes", {})["runsc"] = want
os.makedirs(os.path.dirname(conf), exist_ok=True)
tmp = conf + ".tmp"
with open(tmp, "w") as f:
    json.dump(cfg, f, indent=2)
    f.write("\n")
os.replace(tmp, conf)
PY
}

if [ "$gvisor" = 1 ]; then
  if [ "$(id -u)" != 0 ]; then
    if ! docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; then
      echo "setup-docker: registering runsc in /etc/docker/daemon.json needs root" >&2
      exit 1
    fi
  else
    rc=0
    register_runsc || rc=$?
    if [ "$rc" = 0 ]; then
      echo "setup-docker: registered runsc ($(command -v runsc) $RUNSC_ARGS) in /etc/docker/daemon.json" >&2
      if pid=$(pidof dockerd); then
        echo "setup-docker: reloading dockerd (SIGHUP to $pid; no restart)" >&2
        kill -HUP $pid
        for _ in $(seq 1 20); do
          docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"' && break
          sleep 0.5
        done
      fi
    elif [ "$rc" != 3 ]; then
      echo "setup-docker: could not update /etc/docker/daemon.json" >&2
      exit 1
    fi
  fi
fi

if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup-docker: the Docker daemon does not answer; start it (systemctl start docker)" >&2
    exit 1
  fi
  # A daemon that dies while it starts (one was SIGKILLed four seconds in, while a
  # machine's earlier processes were being stopped) is started again, up to three times.
  : >/var/log/dockerd.log
  # Pid files left by daemons that were killed with the machine's other processes: when
  # their pid now belongs to another process, dockerd takes it for its containerd
  # ("containerd is still running"), waits for a socket nobody serves and gives up
  # (CI failed this way). A pid file whose process is not the daemon it names goes.
  for entry in /var/run/docker/containerd/containerd.pid:containerd /var/run/docker.pid:dockerd; do
    file=${entry%%:*} name=${entry##*:}
    [ -f "$file" ] || continue
    pid=$(cat "$file" 2>/dev/null || true)
    if [ -z "$pid" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "$name" ]; then
      echo "setup-docker: removing stale $file (pid ${pid:-none} is not $name)" >&2
      rm -f "$file"
    fi
  done
  for attempt in 1 2 3; do
    echo "setup-docker: starting dockerd (log: /var/log/dockerd.log, attempt $attempt)" >&2
    nohup dockerd >>/var/log/dockerd.log 2>&1 &
    dpid=$!
    for _ in $(seq 1 90); do
      docker info >/dev/null 2>&1 && break 2
      kill -0 "$dpid" 2>/dev/null || break
      sleep 1
    done
    if kill -0 "$dpid" 2>/dev/null; then break; fi
    wait "$dpid" 2>/dev/null || echo "setup-docker: dockerd exited with status $? while starting" >&2
    sleep 2
  done
fi
if ! docker info >/dev/null 2>&1; then
  echo "setup-docker: dockerd did not come up; see /var/log/dockerd.log" >&2
  tail -20 /var/log/dockerd.log >&2 || true
  exit 1
fi
if [ "$gvisor" = 1 ] && ! docker info --format '{{json .Runtimes}}' | grep -q '"runsc"'; then
  echo "setup-docker: dockerd does not list the runsc runtime after the reload; see /var/log/dockerd.log" >&2
  exit 1
fi
echo "setup-docker: $(docker version --format 'Docker {{.Server.Version}} (API {{.Server.APIVersion}})') is up$([ "$gvisor" = 1 ] && echo ', runtime runsc registered')" >&2
