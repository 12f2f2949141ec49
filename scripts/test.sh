#!/usr/bin/env bash
# The test command: Docker up, the sandbox image built (offline when no registry answers),
# the whole suite against the real daemon, then a check that no container of ours is left.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-docker.sh
# uv (from PyPI) makes the uv venv of the environment tests.
python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet --disable-pip-version-check uv
cargo build --all-targets
cargo run --quiet -- image build
cargo test -- --test-threads=2

left=$(docker ps -aq --filter label=io.mcp-code-executor.managed=true)
if [ -n "$left" ]; then
  echo "test.sh: containers left behind by the tests:" >&2
  docker ps -a --filter label=io.mcp-code-executor.managed=true >&2
  exit 1
fi
echo "test.sh: no container of ours is left" >&2
