#!/usr/bin/env bash
# What sampling the usage history costs the token-bucket path, in one run,
# on both stores: the load of scripts/benchmark.sh (closed loop) spread
# over many tenants, so that every sampling round has many buckets whose
# totals changed, against a server that samples nothing (--history-interval
# 0s) and one that samples every second (ten times the default, to make
# the cost visible). The two take turns, round after round, each on a
# fresh store; the spread between rounds of the same kind is printed
# beside the ratio. Then the history's size: rows kept and bytes per row.
#
# Usage: scripts/benchmark-history.sh   (ROUNDS=3, DURATION=8s,
#        TENANTS=500, STORES="embedded postgres")
# Needs: a PostgreSQL server (DATABASE_URL, default
# postgres://postgres@127.0.0.1:5432/postgres), psql, python3.
# Results go to target/benchmarks-history/ (one JSON per run).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8s}
STORES=${STORES:-embedded postgres}
TENANTS=${TENANTS:-500}
INSTANCES=1
BASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
OUT=target/benchmarks-history
BIN=target/release/tollgate
PORT=${PORT:-50658}
SERVER=http://127.0.0.1:${PORT}
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
PSQL=${PSQL:-psql}
DB=tollgate_bench_history
BENCH_URL=$(database_url "$BASE_URL" "$DB")

build_fresh

for round in $(seq 1 "$ROUNDS"); do
    if (( round % 2 )); then order="off sampled"; else order="sampled off"; fi
    for kind in $order; do
        for store in $STORES; do
            echo "==> round $round/$ROUNDS: $store store, history $kind"
            # shellcheck disable=SC2207
            args=($(fresh_store "$store"))
            if [[ $kind == off ]]; then interval=0s; else interval=1s; fi
            start_server "${args[@]}" --history-interval "$interval"
            bench "$store-$kind-r$round"
            stop_server
            if [[ $store == postgres && $kind == sampled ]]; then
                "$PSQL" -qAt "$BENCH_URL" -c "SELECT 'postgres history: ' || count(*) || ' rows, ' || pg_total_relation_size('tollgate_usage_history') || ' bytes, ' || (pg_total_relation_size('tollgate_usage_history') / greatest(count(*), 1)) || ' bytes a row (with indexes)' FROM tollgate_usage_history" | tee -a "$OUT/size.txt"
            fi
        done
    done
done
if [[ " $STORES " == *" postgres "* ]]; then
    "$PSQL" -q "$BASE_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)"
fi

python3 scripts/bench-summary.py "$OUT" "$ROUNDS" "$STORES" off sampled "history sampled every second" requests/s
