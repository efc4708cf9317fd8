#!/usr/bin/env bash
# Overload: where the server's capacity ends and how it degrades past it.
#
# The server (`serve --in-memory`) runs on core 0 limited to SERVER_CPUS
# of it (a CPU cgroup, 10 ms periods), the load generator on core 1: so
# the load generator can offer several times what the server can serve on
# a two-core machine. Steps:
#   1. capacity: the goodput of a closed loop of the fleet, 40 000 pods of
#      20 000 tenants, each sending its next request as soon as the last is
#      answered (or, refused, after the pause the server asked for);
#   2. open loop at 1×, 2× and 5× that rate, the same fleet;
#   3. a herd: 1× with every pod's first request at the start, on a fresh
#      server;
#   4. before each server stops, the consumption it stored for every
#      tenant (its /metrics) against what the pods saw confirmed, plus what
#      they abandoned unanswered (scripts/check-stored-totals.py): nothing
#      lost, nothing counted twice. A difference fails the script.
# With BEFORE=/path/to/an/older/tollgate the same rates run against that
# server too (capacity measured once, on this build; this build's load
# generator in every run), for before/after tables.
#
# Usage: sudo scripts/benchmark-overload.sh   (DURATION=20s by default)
#        BEFORE=/tmp/tollgate-old SERVER_CPUS=0.5 scripts/benchmark-overload.sh
#        CAPACITY=4221 LOADS=2 HERD=0 SERVER_ARGS="--max-pending-requests 64" \
#            scripts/benchmark-overload.sh   (one load against a given capacity,
#            the server with other options)
# Needs: root (for the cgroup; without it the server is only pinned),
# taskset, python3.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-20s}
SERVER_CPUS=${SERVER_CPUS:-0.5}
TENANTS=20000
INSTANCES=2
OUT=target/benchmarks/overload
BIN=target/release/tollgate
PORT=${PORT:-50652}
SERVER=http://127.0.0.1:${PORT}
METRICS_LISTEN=127.0.0.1:$((PORT + 1))
CGROUP=tollgate-bench-server
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

build_fresh

# Puts the calling shell's children in a cgroup of SERVER_CPUS CPUs.
cpu_cgroup() {
    local quota
    quota=$(python3 -c "print(int(float('$SERVER_CPUS') * 10000))")
    if [[ -d /sys/fs/cgroup/cpu && -w /sys/fs/cgroup/cpu ]]; then
        mkdir -p "/sys/fs/cgroup/cpu/$CGROUP"
        echo 10000 >"/sys/fs/cgroup/cpu/$CGROUP/cpu.cfs_period_us"
        echo "$quota" >"/sys/fs/cgroup/cpu/$CGROUP/cpu.cfs_quota_us"
        echo "/sys/fs/cgroup/cpu/$CGROUP/cgroup.procs"
    elif [[ -f /sys/fs/cgroup/cgroup.controllers && -w /sys/fs/cgroup ]]; then
        mkdir -p "/sys/fs/cgroup/$CGROUP"
        echo "$quota 10000" >"/sys/fs/cgroup/$CGROUP/cpu.max"
        echo "/sys/fs/cgroup/$CGROUP/cgroup.procs"
    else
        echo "no writable CPU cgroup: the server gets all of core 0" >&2
        echo /dev/null
    fi
}
PROCS=$(cpu_cgroup)

start_limited() { # binary
    local bin=$1
    RUST_LOG=warn bash -c "echo \$\$ >$PROCS; exec taskset -c 0 $bin serve --in-memory --listen 127.0.0.1:${PORT} --metrics-listen ${METRICS_LISTEN} ${SERVER_ARGS:-}" 2>>"$OUT/server.log" &
    server_pid=$!
    wait_for_server
}

fleet() { # label, bench args…
    local label=$1
    shift
    echo "==> $label"
    taskset -c 1 "$BIN" bench --server "$SERVER" --tenants "$TENANTS" --instances-per-tenant "$INSTANCES" \
        --duration "$DURATION" --warmup 2s --json "$@" >"$OUT/$label.json"
}

# Nothing lost or counted twice: the totals the server stored against what
# the pods of the runs $2… (labels) saw, before the server ($1) stops.
check_totals() {
    local name=$1 label reports=()
    shift
    curl -s --max-time 60 "http://${METRICS_LISTEN}/metrics" >"$OUT/$name.prom"
    for label in "$@"; do reports+=("$OUT/$label.json"); done
    python3 scripts/check-stored-totals.py "$OUT/$name.prom" "${reports[@]}" | tee "$OUT/$name.totals.txt" ||
        totals_failed=1
}
totals_failed=0

# The fleet's tenants and instances exist before anything is measured.
warm() { DURATION=5s fleet "$1-warm" --rate 3000; }

# Capacity, on this build (unless given).
if [[ -z "${CAPACITY:-}" ]]; then
    start_limited "$BIN"
    warm capacity
    fleet capacity
    CAPACITY=$(python3 -c 'import json, sys; print(int(json.load(open(sys.argv[1]))["goodput_per_second"]))' "$OUT/capacity.json")
    echo "capacity: $CAPACITY requests/s"
    check_totals capacity capacity-warm capacity
    stop_server
fi

measure() { # server binary, prefix
    local bin=$1 prefix=$2
    start_limited "$bin"
    warm "$prefix"
    local k runs=("$prefix-warm")
    for k in ${LOADS:-1 2 5}; do
        fleet "$prefix-${k}x" --rate $((CAPACITY * k))
        runs+=("$prefix-${k}x")
    done
    check_totals "$prefix" "${runs[@]}"
    stop_server
    [[ "${HERD:-1}" == 1 ]] || return 0
    # A herd meets a fresh server, as after an outage of the whole fleet.
    start_limited "$bin"
    fleet "$prefix-herd" --rate "$CAPACITY" --herd
    check_totals "$prefix-herd" "$prefix-herd"
    stop_server
}

measure "$BIN" after
if [[ -n "${BEFORE:-}" ]]; then
    measure "$BEFORE" before
fi

python3 - "$OUT" "$CAPACITY" <<'PY'
import json, os, sys
out, capacity = sys.argv[1], int(sys.argv[2])
print(f"\ncapacity (goodput of the fleet in a closed loop): {capacity} requests/s\n")
print("| build | load | offered/s | goodput/s | of capacity | p50 ms | p99 ms | p99 answered attempt ms | refused (retried) | transport errors | abandoned |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for prefix in ("before", "after"):
    for load in ("1x", "2x", "5x", "herd"):
        path = os.path.join(out, f"{prefix}-{load}.json")
        if not os.path.exists(path):
            continue
        r = json.load(open(path))
        t = r["total"]
        retried = t["retried"]
        refused = retried.get("Unavailable", 0)
        transport = sum(v for k, v in retried.items() if k != "Unavailable")
        attempt = r.get("answered_attempt_latency_us", {}).get("p99")
        attempt = "—" if attempt is None else f"{attempt / 1000:.1f}"
        print(f"| {prefix} | {load} | {r['target_rate']:.0f} | {r['goodput_per_second']:.0f} | "
              f"{r['goodput_per_second'] / capacity:.0%} | {r['latency_us']['p50'] / 1000:.1f} | "
              f"{r['latency_us']['p99'] / 1000:.1f} | {attempt} | {refused} | {transport} | {t['abandoned']} |")
PY
if [[ "$totals_failed" != 0 ]]; then
    echo "stored totals differ from what the pods saw: see $OUT/*.totals.txt" >&2
    exit 1
fi
