#!/usr/bin/env bash
# Latency at normal load on the PostgreSQL store, and where it goes.
#
# `tollgate serve` on a fresh PostgreSQL database, `tollgate bench` with
# 64 pods of 4 tenants: a closed loop for the most requests/s, then RUNS
# open-loop runs at half that rate. Around each open-loop run it reads
#   - the server's /metrics: the RPC's own time (tollgate_rpc_duration_seconds)
#     and the store's stages (tollgate_store_stage_seconds: queued, begin,
#     read, write, commit), and transactions committed;
#   - /proc: the CPU time of the server, the load generator and every
#     PostgreSQL process, per request;
# and with PROFILE=1 it records the whole machine with `perf record -a -g`
# during the last run (target/benchmarks/postgres-latency/perf.data;
# summarised by process and by the server's top functions).
#
# With BEFORE=/path/to/an/older/tollgate its server is measured the same
# way first, on a fresh database (this build's load generator in every
# run), for a before/after table from one run.
#
# Usage: scripts/benchmark-postgres-latency.sh   (DURATION=20s, RUNS=3)
#        PROFILE=1 BEFORE=/tmp/tollgate-old scripts/benchmark-postgres-latency.sh
#        DATABASE_URL=postgres://user@host/db scripts/benchmark-postgres-latency.sh
# Needs: a PostgreSQL server (default postgres://postgres@127.0.0.1:5432/postgres),
# psql, python3; perf for PROFILE=1.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-20s}
RUNS=${RUNS:-3}
TENANTS=4
INSTANCES=16
BASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
OUT=target/benchmarks/postgres-latency
BIN=target/release/tollgate
PORT=${PORT:-50653}
METRICS_PORT=$((PORT + 1))
METRICS_LISTEN=127.0.0.1:${METRICS_PORT}
SERVER=http://127.0.0.1:${PORT}
PSQL=${PSQL:-psql}
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
BENCH_URL=$(database_url "$BASE_URL" tollgate_latency)

# CPU ticks of the server, of every PostgreSQL process, and of the whole
# machine busy and in all, in one line.
cpu_ticks() {
    python3 - "$server_pid" <<'PY'
import os, sys
def ticks(pid):
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime
    except (OSError, IndexError):
        return 0
postgres = sum(ticks(p) for p in os.listdir("/proc") if p.isdigit()
               and open(f"/proc/{p}/comm").read().strip() in ("postgres", "postmaster"))
user, nice, system, idle, iowait, irq, softirq = (
    int(x) for x in open("/proc/stat").readline().split()[1:8])
busy = user + nice + system + irq + softirq
print(ticks(sys.argv[1]), postgres, busy, busy + idle + iowait)
PY
}

# The open-loop run $1 at $rate, its CPU seconds (user, system) in
# $1.bench-cpu.
timed_bench() {
    local TIMEFORMAT='%U %S'
    { time bench "$1" --rate "$rate" 2>&3; } 3>&2 2>"$OUT/$1.bench-cpu"
}

# Measures the server binary $2 under the name $1 (files $1-*), on a fresh
# database: the max, then RUNS runs at half of it (the last profiled with
# PROFILE=1 and $3 = profile).
measure() {
    local name=$1 run label
    SERVER_BIN=$2
    "$PSQL" -q "$BASE_URL" -c "DROP DATABASE IF EXISTS tollgate_latency WITH (FORCE)" -c "CREATE DATABASE tollgate_latency"
    start_server --store "$BENCH_URL"
    bench "$name-max"
    rate=$(rate_of "$OUT/$name-max.json")
    for run in $(seq 1 "$RUNS"); do
        label=$name-half-$run
        curl -s "http://${METRICS_LISTEN}/metrics" >"$OUT/$label.before.prom"
        cpu_ticks >"$OUT/$label.before.cpu"
        if [[ "${PROFILE:-0}" == 1 && "${3:-}" == profile && "$run" == "$RUNS" ]]; then
            profiled_server=$server_pid
            perf record -a -g -F 999 -o "$OUT/perf.data" -- sleep "${DURATION%s}" 2>"$OUT/perf.log" &
            local perf_pid=$!
            timed_bench "$label"
            wait "$perf_pid"
        else
            timed_bench "$label"
        fi
        cpu_ticks >"$OUT/$label.after.cpu"
        curl -s "http://${METRICS_LISTEN}/metrics" >"$OUT/$label.after.prom"
    done
    stop_server
}

build_fresh
names=()
if [[ -n "${BEFORE:-}" ]]; then
    measure before "$BEFORE"
    names+=(before)
fi
measure after "$BIN" profile
names+=(after)

if [[ "${PROFILE:-0}" == 1 ]]; then
    # Samples per process (the server and the load generator share a
    # binary: told apart by pid), and the server's hottest functions.
    perf script -i "$OUT/perf.data" -F pid,comm 2>/dev/null |
        awk -v server="$profiled_server" '{ name = ($2 == server) ? "tollgate serve" : ($1 == "tokio-rt-worker" ? "tollgate bench" : $1); n[name]++; all++ }
             END { for (k in n) printf "%6.2f %%  %s\n", 100 * n[k] / all, k }' |
        sort -rn | head -n 8 >"$OUT/perf-by-process.txt"
    perf report -i "$OUT/perf.data" --no-children --pid "$profiled_server" --sort symbol -g none --stdio 2>/dev/null |
        grep "%" | sed "s/ *- *- *$//" | head -n 20 >"$OUT/perf-server-symbols.txt" || true
fi

python3 scripts/postgres-latency-report.py "$OUT" "$RUNS" "${names[@]}"
