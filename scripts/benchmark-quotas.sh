#!/usr/bin/env bash
# What a calendar quota costs the per-key path, in one run, on both
# stores: the load of scripts/benchmark-checks.sh (one token of one key
# per call, keys drawn from a million with 90 % of calls on the 1 000
# hottest, 10 per second each, closed loop, CALLERS callers) against a
# per-key bucket without a quota, then with one (a monthly quota per key
# that is never reached, so every allowed check pays for the accounting
# and none is refused by it). The two take turns, round after round, each
# on a fresh store; the spread between rounds of the same kind is printed
# beside the ratio.
#
# Usage: scripts/benchmark-quotas.sh   (ROUNDS=3, DURATION=8s, CALLERS=64,
#        STORES="embedded postgres")
# Needs: a PostgreSQL server (DATABASE_URL, default
# postgres://postgres@127.0.0.1:5432/postgres), psql, python3.
# Results go to target/benchmarks-quotas/ (one JSON per run).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8s}
CALLERS=${CALLERS:-64}
STORES=${STORES:-embedded postgres}
TENANTS=1
INSTANCES=$CALLERS
BASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
OUT=target/benchmarks-quotas
BIN=target/release/tollgate
PORT=${PORT:-50659}
SERVER=http://127.0.0.1:${PORT}
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
PSQL=${PSQL:-psql}
DB=tollgate_bench_quotas
BENCH_URL=$(database_url "$BASE_URL" "$DB")
CHECKS=(--checks --keys 1000000 --hot-keys 1000 --hot-fraction 0.9 --key-rate 10 --key-burst 100)

build_fresh

for round in $(seq 1 "$ROUNDS"); do
    if (( round % 2 )); then order="plain quota"; else order="quota plain"; fi
    for kind in $order; do
        for store in $STORES; do
            echo "==> round $round/$ROUNDS: $store store, $kind"
            # shellcheck disable=SC2207
            args=($(fresh_store "$store"))
            start_server "${args[@]}"
            if [[ $kind == quota ]]; then
                bench "$store-$kind-r$round" "${CHECKS[@]}" --key-quota 1e15
            else
                bench "$store-$kind-r$round" "${CHECKS[@]}"
            fi
            stop_server
        done
    done
done
if [[ " $STORES " == *" postgres "* ]]; then
    "$PSQL" -q "$BASE_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)"
fi

python3 scripts/bench-summary.py "$OUT" "$ROUNDS" "$STORES" plain quota "a quota" checks/s
