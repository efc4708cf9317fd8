#!/usr/bin/env bash
# Measures what one acquisition costs a pod, by the way it is made, all in
# one run on the embedded store (one token per call, tokens plentiful):
#   - in process: tollgate-client in the load generator (the floor);
#   - through `tollgate agent`, over its Unix socket (what a pod in any
#     other language pays);
#   - a per-key `KeyLimits/Check` to the server (a round trip and a store
#     transaction);
#   - Envoy's ShouldRateLimit answered by the agent from its local bucket,
#     against the same call with a per-key descriptor answered by the
#     server.
# Each: closed loop with CALLERS callers (the maximum), then open loop at
# half that maximum (latency). Results go to target/benchmarks-agent/, and
# a markdown table is printed.
#
# Usage: scripts/benchmark-agent.sh   (DURATION=10s; TENANTS=4; INSTANCES=16)
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
TENANTS=${TENANTS:-4}
INSTANCES=${INSTANCES:-16}
OUT=target/benchmarks-agent
BIN=target/release/tollgate
PORT=${PORT:-50753}
ENVOY_PORT=${ENVOY_PORT:-50754}
SERVER=http://127.0.0.1:${PORT}
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

build_fresh
WORK=$(mktemp -d)
agent_pid=""
cleanup() {
    if [[ -n "$agent_pid" ]]; then
        kill -TERM "$agent_pid" 2>/dev/null || true
        wait "$agent_pid" 2>/dev/null || true
    fi
    stop_server
    rm -rf "$WORK"
}
trap cleanup EXIT

start_server --store "$WORK/store.redb" --create
SOCKET=$WORK/agent.sock
RUST_LOG=warn "$BIN" agent --server "$SERVER" --socket "$SOCKET" --state-dir "$WORK/agent" \
    --envoy-listen "127.0.0.1:${ENVOY_PORT}" 2>>"$OUT/agent.log" &
agent_pid=$!
for _ in $(seq 1 100); do
    [[ -S "$SOCKET" ]] && break
    sleep 0.1
done
[[ -S "$SOCKET" ]] || { echo "the agent did not start; see $OUT/agent.log" >&2; exit 1; }

run_pair() { # label, bench args…
    local label=$1
    shift
    # Tenants of their own: each run sets up its buckets its own way.
    set -- --tenant-prefix "b-$label" "$@"
    bench "$label-max" "$@"
    local half
    half=$(python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(int(r.get("calls_per_second") or r.get("checks_per_second")) // 2)' "$OUT/$label-max.json")
    bench "$label-half" "$@" --rate "$half"
}

run_pair in-process --local in-process
run_pair agent --local agent --agent-socket "$SOCKET"
run_pair check --checks --keys 1000000 --hot-keys 1000 --hot-fraction 0 --key-rate 1e9 --key-burst 1e9
run_pair envoy-agent --local envoy --envoy "http://127.0.0.1:${ENVOY_PORT}"
run_pair envoy-server --local envoy-per-key --envoy "$SERVER"

python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
rows = [
    ("in-process", "Acquire in process (tollgate-client)"),
    ("agent", "Acquire through the agent (Unix socket)"),
    ("check", "Per-key Check to the server"),
    ("envoy-agent", "Envoy ShouldRateLimit, shared bucket, answered by the agent"),
    ("envoy-server", "Envoy ShouldRateLimit, per key, answered by the server"),
]
def rate(r):
    return r.get("calls_per_second") or r.get("checks_per_second")
print("| What | max calls/s (closed loop) | p50 / p99 µs at half load | errors |")
print("|---|---:|---:|---:|")
results = {}
for label, name in rows:
    top = json.load(open(f"{out}/{label}-max.json"))
    half = json.load(open(f"{out}/{label}-half.json"))
    lat = half["latency_us"]
    errors = sum(top["errors"].values()) + sum(half["errors"].values())
    results[label] = (rate(top), lat["p50"], lat["p99"])
    print(f"| {name} | {rate(top):.0f} | {lat['p50']} / {lat['p99']} (at {half['target_rate']:.0f}/s) | {errors} |")
ip, ag, ck = results["in-process"], results["agent"], results["check"]
ea, es = results["envoy-agent"], results["envoy-server"]
print()
print(f"- agent / in process: throughput {ag[0] / ip[0]:.2f} ×, p99 {ag[2] / max(ip[2], 1):.1f} ×")
print(f"- agent / per-key Check: throughput {ag[0] / ck[0]:.2f} ×, p99 {ag[2] / max(ck[2], 1):.2f} ×")
print(f"- Envoy via agent / via server: throughput {ea[0] / es[0]:.2f} ×, p99 {ea[2] / max(es[2], 1):.2f} ×")
print(f"- goals: p99 of a local acquire at half load {ag[2]} µs (goal ≤ 200 µs); {ag[0]:.0f} acquisitions/s (goal ≥ 50 000)")
PY
