#!/usr/bin/env bash
# What a budget costs the token-bucket path, in one run, on both stores:
# the load of scripts/benchmark.sh (64 pods of 4 tenants, closed loop)
# against request-unit buckets without a budget, then with one (monthly,
# throttle at the limit, an amount never reached, so every request pays
# for the accounting and none is cut). The two take turns, round after
# round, each on a fresh store; the spread between rounds of the same kind
# is printed beside the ratio.
#
# Usage: scripts/benchmark-budgets.sh   (ROUNDS=3, DURATION=8s,
#        STORES="embedded postgres")
# Needs: a PostgreSQL server (DATABASE_URL, default
# postgres://postgres@127.0.0.1:5432/postgres), psql, python3.
# Results go to target/benchmarks-budgets/ (one JSON per run).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8s}
STORES=${STORES:-embedded postgres}
TENANTS=4
INSTANCES=16
BASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
OUT=target/benchmarks-budgets
BIN=target/release/tollgate
PORT=${PORT:-50657}
SERVER=http://127.0.0.1:${PORT}
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
PSQL=${PSQL:-psql}
DB=tollgate_bench_budgets
BENCH_URL=$(database_url "$BASE_URL" "$DB")

build_fresh

give_budgets() {
    for i in $(seq 0 $((TENANTS - 1))); do
        TOLLGATE_SERVER=$SERVER "$BIN" budget set --tenant "bench-$i" --amount 1e15 \
            --cycle monthly --at-limit throttle --baseline-rate 100 >/dev/null
    done
}

for round in $(seq 1 "$ROUNDS"); do
    if (( round % 2 )); then order="plain budget"; else order="budget plain"; fi
    for kind in $order; do
        for store in $STORES; do
            echo "==> round $round/$ROUNDS: $store store, $kind"
            # shellcheck disable=SC2207
            args=($(fresh_store "$store"))
            start_server "${args[@]}"
            if [[ $kind == budget ]]; then give_budgets; fi
            bench "$store-$kind-r$round"
            stop_server
        done
    done
done
if [[ " $STORES " == *" postgres "* ]]; then
    "$PSQL" -q "$BASE_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)"
fi

python3 scripts/bench-summary.py "$OUT" "$ROUNDS" "$STORES" plain budget "a budget" requests/s
