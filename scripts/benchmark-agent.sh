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
# Envoy's calls come over TCP: they show their tenant's token.
ENVOY_TOKEN=bench-envoy-token
{
    for i in $(seq 0 $((TENANTS - 1))); do
        printf '[tenants.b-agent-%s]\n' "$i"
        printf '[tenants.b-envoy-agent-%s]\ntoken = "%s"\n' "$i" "$ENVOY_TOKEN"
    done
} >"$WORK/access.toml"
RUST_LOG=warn "$BIN" agent --server "$SERVER" --socket "$SOCKET" --state-dir "$WORK/agent" \
    --access "$WORK/access.toml" --envoy-listen "127.0.0.1:${ENVOY_PORT}" 2>>"$OUT/agent.log" &
agent_pid=$!
for _ in $(seq 1 100); do
    [[ -S "$SOCKET" ]] && break
    sleep 0.1
done
[[ -S "$SOCKET" ]] || { echo "the agent did not start; see $OUT/agent.log" >&2; exit 1; }

# Tenants of their own per kind of run: each sets up its buckets its own way.
run() { # label, kind, bench args…
    local label=$1 kind=$2
    shift 2
    bench "$label" --tenant-prefix "b-$kind" "$@"
}
calls_per_second() {
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(int(r.get("calls_per_second") or r.get("checks_per_second") or 0))' "$OUT/$1.json"
}

IN_PROCESS=(--local in-process)
AGENT=(--local agent --agent-socket "$SOCKET")
CHECK=(--checks --keys 1000000 --hot-keys 1000 --hot-fraction 0 --key-rate 1e9 --key-burst 1e9)
ENVOY_AGENT=(--local envoy --envoy "http://127.0.0.1:${ENVOY_PORT}" --pod-token "$ENVOY_TOKEN")
ENVOY_SERVER=(--local envoy-per-key --envoy "$SERVER")

# The maximum of each: closed loop.
run in-process-max in-process "${IN_PROCESS[@]}"
run agent-max agent "${AGENT[@]}"
run check-max check "${CHECK[@]}"
run envoy-agent-max envoy-agent "${ENVOY_AGENT[@]}"
run envoy-server-max envoy-server "${ENVOY_SERVER[@]}"

# Latency at one offered rate per comparison: half the slower one's
# maximum, so that both can carry it; and a light load (LIGHT calls/s).
LIGHT=${LIGHT:-1000}
HALF=$(($(python3 -c 'import sys; print(min(int(a) for a in sys.argv[1:]))' "$(calls_per_second agent-max)" "$(calls_per_second check-max)") / 2))
for kind in in-process agent check; do
    case $kind in
    in-process) args=("${IN_PROCESS[@]}") ;;
    agent) args=("${AGENT[@]}") ;;
    check) args=("${CHECK[@]}") ;;
    esac
    run "$kind-half" "$kind" "${args[@]}" --rate "$HALF"
    run "$kind-light" "$kind" "${args[@]}" --rate "$LIGHT"
done
ENVOY_HALF=$(($(python3 -c 'import sys; print(min(int(a) for a in sys.argv[1:]))' "$(calls_per_second envoy-agent-max)" "$(calls_per_second envoy-server-max)") / 2))
run envoy-agent-half envoy-agent "${ENVOY_AGENT[@]}" --rate "$ENVOY_HALF"
run envoy-server-half envoy-server "${ENVOY_SERVER[@]}" --rate "$ENVOY_HALF"

python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
def load(label):
    return json.load(open(f"{out}/{label}.json"))
def rate(r):
    return r.get("calls_per_second") or r.get("checks_per_second") or 0
def lat(label):
    r = load(label)
    l = r["latency_us"]
    return f"{l['p50']} / {l['p99']} (at {r['target_rate']:.0f}/s)", l["p99"]
rows = [
    ("in-process", "Acquire in process (tollgate-client)", True),
    ("agent", "Acquire through the agent (Unix socket)", True),
    ("check", "Per-key Check to the server", True),
    ("envoy-agent", "Envoy ShouldRateLimit, shared bucket, answered by the agent", False),
    ("envoy-server", "Envoy ShouldRateLimit, per key, answered by the server", False),
]
print("| What | max calls/s (closed loop) | p50 / p99 µs at half load | p50 / p99 µs at a light load | errors |")
print("|---|---:|---:|---:|---:|")
top = {}
for kind, name, light in rows:
    labels = [f"{kind}-max", f"{kind}-half"] + ([f"{kind}-light"] if light else [])
    errors = sum(sum(load(l)["errors"].values()) for l in labels)
    half, half_p99 = lat(f"{kind}-half")
    light_text = lat(f"{kind}-light")[0] if light else "—"
    top[kind] = (rate(load(f"{kind}-max")), half_p99)
    print(f"| {name} | {rate(load(f'{kind}-max')):.0f} | {half} | {light_text} | {errors} |")
print()
ip, ag, ck = top["in-process"], top["agent"], top["check"]
ea, es = top["envoy-agent"], top["envoy-server"]
print(f"- agent / in process: throughput {ag[0] / ip[0]:.4f} ×, p99 at the same rate {ag[1] / max(ip[1], 1):.1f} ×")
print(f"- agent / per-key Check: throughput {ag[0] / ck[0]:.2f} ×, p99 at the same rate {ag[1] / max(ck[1], 1):.2f} ×")
print(f"- Envoy via agent / via server: throughput {ea[0] / es[0]:.2f} ×, p99 at the same rate {ea[1] / max(es[1], 1):.2f} ×")
print(f"- goals: p99 of a local acquire at half load {ag[1]} µs (goal ≤ 200 µs); {ag[0]:.0f} acquisitions/s (goal ≥ 50 000)")
PY
