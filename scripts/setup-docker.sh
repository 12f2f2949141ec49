#!/usr/bin/env bash
# Make sure a Docker daemon answers on this machine: install docker.io, debootstrap (for
# the offline base image) and docker-compose (the deployment and its test) when missing, and start dockerd when `docker info`
# fails. Idempotent; needs root only when something is missing.
set -euo pipefail

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v docker >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
if ((${#need[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "setup-docker: ${need[*]} missing and not root: install them (apt-get install ${need[*]})" >&2
    exit 1
  fi
  echo "setup-docker: installing ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup-docker: the Docker daemon does not answer; start it (systemctl start docker)" >&2
    exit 1
  fi
  echo "setup-docker: starting dockerd (log: /var/log/dockerd.log)" >&2
  nohup dockerd >/var/log/dockerd.log 2>&1 &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
fi
if ! docker info >/dev/null 2>&1; then
  echo "setup-docker: dockerd did not come up; see /var/log/dockerd.log" >&2
  tail -20 /var/log/dockerd.log >&2 || true
  exit 1
fi
echo "setup-docker: $(docker version --format 'Docker {{.Server.Version}} (API {{.Server.APIVersion}})') is up" >&2
