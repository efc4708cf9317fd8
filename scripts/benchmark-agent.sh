#!/usr/bin/env bash
# Measures what one acquisition costs a pod, by the way it is made, all in
# one run on the embedded store (one token per call, tokens plentiful):
#   - in process: tollgate-client in the load generator (the floor of a
#     Rust pod);
#   - through `tollgate agent`, over its Unix socket (what a pod in any
#     other language pays), with one HTTP/2 connection for the 64 callers
#     and with a connection each;
#   - the transport's floor: the agent's gRPC service on the same stack,
#     answering Acquire at once (crates/tollgate-agent/examples/
#     answer_at_once.rs): what no change to the agent's own work can remove;
#   - a per-key `KeyLimits/Check` to the server (a round trip and a store
#     transaction);
#   - Envoy's ShouldRateLimit answered by the agent from its local bucket,
#     against the same call with a per-key descriptor answered by the
#     server.
# Each: closed loop with 64 callers (the maximum), then open loop (paced to
# the tens of microseconds, see crates/tollgate/src/bench/pacer.rs) at half
# the agent's own maximum, at one rate for the comparisons (half the slower
# one's maximum) and at a light LIGHT calls/s.
#
# On a machine of two cores or more the agent (and the floor) is kept on
# CPU 0 and the load generator on CPU 1 (taskset), so that neither takes
# the other's core; the server is left free.
#
# Results go to target/benchmarks-agent/, and a markdown table is printed.
#
# Usage: scripts/benchmark-agent.sh   (DURATION=8s; LIGHT=1000)
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-8s}
TENANTS=4
INSTANCES=16
OUT=target/benchmarks-agent
BIN=target/release/tollgate
FLOOR_BIN=target/release/examples/answer_at_once
PORT=${PORT:-50753}
ENVOY_PORT=${ENVOY_PORT:-50754}
SERVER=http://127.0.0.1:${PORT}
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

AGENT_PIN=()
if [[ $(nproc) -ge 2 ]] && command -v taskset >/dev/null; then
    AGENT_PIN=(taskset -c 0)
    BENCH_CPU=1
else
    echo "==> fewer than two cores (or no taskset): nothing is pinned" >&2
fi

build_fresh
cargo build --release --locked -q -p tollgate-agent --example answer_at_once
WORK=$(mktemp -d)
agent_pid=""
floor_pid=""
cleanup() {
    for pid in "$agent_pid" "$floor_pid"; do
        if [[ -n "$pid" ]]; then
            kill -TERM "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    stop_server
    rm -rf "$WORK"
}
trap cleanup EXIT

wait_for_socket() { # path, log
    for _ in $(seq 1 100); do
        [[ -S "$1" ]] && return
        sleep 0.1
    done
    echo "nothing listens on $1; see $2" >&2
    exit 1
}

start_server --store "$WORK/store.redb" --create
SOCKET=$WORK/agent.sock
FLOOR_SOCKET=$WORK/floor.sock
# Envoy's calls come over TCP: they show their tenant's token.
ENVOY_TOKEN=bench-envoy-token
{
    for i in $(seq 0 $((TENANTS - 1))); do
        printf '[tenants.b-agent-%s]\n' "$i"
        printf '[tenants.b-agent-conn-%s]\n' "$i"
        printf '[tenants.b-envoy-agent-%s]\ntoken = "%s"\n' "$i" "$ENVOY_TOKEN"
    done
} >"$WORK/access.toml"
RUST_LOG=warn "${AGENT_PIN[@]}" "$BIN" agent --server "$SERVER" --socket "$SOCKET" --state-dir "$WORK/agent" \
    --access "$WORK/access.toml" --envoy-listen "127.0.0.1:${ENVOY_PORT}" 2>>"$OUT/agent.log" &
agent_pid=$!
wait_for_socket "$SOCKET" "$OUT/agent.log"
"${AGENT_PIN[@]}" "$FLOOR_BIN" "$FLOOR_SOCKET" 2>>"$OUT/floor.log" &
floor_pid=$!
wait_for_socket "$FLOOR_SOCKET" "$OUT/floor.log"

# Tenants of their own per kind of run: each sets up its buckets its own way.
run() { # label, kind, bench args…
    local label=$1 kind=$2
    shift 2
    bench "$label" --tenant-prefix "b-$kind" "$@"
}
calls_per_second() {
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(int(r.get("calls_per_second") or r.get("checks_per_second") or 0))' "$OUT/$1.json"
}
half_of() { # labels…: half the smallest maximum
    local rates=()
    for label in "$@"; do rates+=("$(calls_per_second "$label")"); done
    python3 -c 'import sys; print(min(int(a) for a in sys.argv[1:]) // 2)' "${rates[@]}"
}

IN_PROCESS=(--local in-process)
AGENT=(--local agent --agent-socket "$SOCKET")
AGENT_CONN=(--local agent --agent-socket "$SOCKET" --connections $((TENANTS * INSTANCES)))
FLOOR=(--local agent --agent-socket "$FLOOR_SOCKET")
CHECK=(--checks --keys 1000000 --hot-keys 1000 --hot-fraction 0 --key-rate 1e9 --key-burst 1e9)
ENVOY_AGENT=(--local envoy --envoy "http://127.0.0.1:${ENVOY_PORT}" --pod-token "$ENVOY_TOKEN")
ENVOY_SERVER=(--local envoy-per-key --envoy "$SERVER")
args_of() { # kind → the array of its bench arguments
    case $1 in
    in-process) echo IN_PROCESS ;;
    agent) echo AGENT ;;
    agent-conn) echo AGENT_CONN ;;
    floor) echo FLOOR ;;
    check) echo CHECK ;;
    envoy-agent) echo ENVOY_AGENT ;;
    envoy-server) echo ENVOY_SERVER ;;
    esac
}
run_kind() { # label, kind, extra args…
    local label=$1 kind=$2
    shift 2
    local -n kind_args
    kind_args=$(args_of "$kind")
    run "$label" "$kind" "${kind_args[@]}" "$@"
}

# The maximum of each: closed loop.
for kind in in-process agent agent-conn floor check envoy-agent envoy-server; do
    run_kind "$kind-max" "$kind"
done

# The goal: the agent at half its own maximum, and the floor at that rate.
AGENT_HALF=$(half_of agent-max)
for kind in agent floor; do
    run_kind "$kind-own-half" "$kind" --rate "$AGENT_HALF"
done
AGENT_CONN_HALF=$(half_of agent-conn-max)
run_kind agent-conn-own-half agent-conn --rate "$AGENT_CONN_HALF"
# Comparisons at one rate both can carry, and at a light load.
LIGHT=${LIGHT:-1000}
HALF=$(half_of agent-max check-max)
for kind in in-process agent floor check; do
    run_kind "$kind-half" "$kind" --rate "$HALF"
    run_kind "$kind-light" "$kind" --rate "$LIGHT"
done
ENVOY_HALF=$(half_of envoy-agent-max envoy-server-max)
run_kind envoy-agent-half envoy-agent --rate "$ENVOY_HALF"
run_kind envoy-server-half envoy-server --rate "$ENVOY_HALF"

python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(label):
    return json.load(open(f"{out}/{label}.json"))
def rate(r):
    return r.get("calls_per_second") or r.get("checks_per_second") or 0
def lat(label):
    if not os.path.exists(f"{out}/{label}.json"):
        return "—", None
    r = load(label)
    l = r["latency_us"]
    return f"{l['p50']} / {l['p99']} (at {r['target_rate']:.0f}/s)", l["p99"]
rows = [
    ("in-process", "Acquire in process (tollgate-client)"),
    ("agent", "Acquire through the agent (Unix socket, one connection)"),
    ("agent-conn", "Acquire through the agent (a connection per caller)"),
    ("floor", "The transport's floor: the same stack answering at once"),
    ("check", "Per-key Check to the server"),
    ("envoy-agent", "Envoy ShouldRateLimit, shared bucket, answered by the agent"),
    ("envoy-server", "Envoy ShouldRateLimit, per key, answered by the server"),
]
print("| What | max calls/s (closed loop) | p50 / p99 µs at half its own max | p50 / p99 µs at a common rate | p50 / p99 µs at a light load | errors |")
print("|---|---:|---:|---:|---:|---:|")
top = {}
for kind, name in rows:
    labels = [l for l in (f"{kind}-max", f"{kind}-own-half", f"{kind}-half", f"{kind}-light") if os.path.exists(f"{out}/{l}.json")]
    errors = sum(sum(load(l)["errors"].values()) for l in labels)
    own, own_p99 = lat(f"{kind}-own-half")
    common, common_p99 = lat(f"{kind}-half")
    light, _ = lat(f"{kind}-light")
    top[kind] = (rate(load(f"{kind}-max")), own_p99, common_p99)
    print(f"| {name} | {rate(load(f'{kind}-max')):.0f} | {own} | {common} | {light} | {errors} |")
print()
lags = [load(l[:-5])["pacing_lag_us"] for l in os.listdir(out) if l.endswith(".json") and "pacing_lag_us" in load(l[:-5])]
if lags:
    print(f"- pacing lag (how late calls were released), worst p99 of the open-loop runs: {max(l['p99'] for l in lags)} µs")
ip, ag, ac, fl, ck = top["in-process"], top["agent"], top["agent-conn"], top["floor"], top["check"]
ea, es = top["envoy-agent"], top["envoy-server"]
print(f"- agent / in process: throughput {ag[0] / ip[0]:.4f} ×, p99 at the same rate {ag[2] / max(ip[2], 1):.1f} ×")
print(f"- agent / the transport's floor: throughput {ag[0] / fl[0]:.2f} ×, p99 at half the agent's max {ag[1] / max(fl[1], 1):.2f} ×")
print(f"- agent / per-key Check: throughput {ag[0] / ck[0]:.2f} ×, p99 at the same rate {ag[2] / max(ck[2], 1):.2f} ×")
print(f"- Envoy via agent / via server: throughput {ea[0] / es[0]:.2f} ×, p99 at the same rate {ea[2] / max(es[2], 1):.2f} ×")
print(f"- goals: p99 at half load {ag[1]} µs (one connection), {ac[1]} µs (a connection per caller); goal ≤ 200 µs. "
      f"Throughput {ag[0]:.0f} and {ac[0]:.0f} acquisitions/s; goal ≥ 50 000")
PY
