#!/usr/bin/env bash
# Measures what owning many buckets costs a tenant: the same pods and load
# with every pod on its tenant's request-unit bucket (--buckets 1) and
# spread over 10 named buckets per tenant (--buckets 10), on the embedded
# store and on PostgreSQL. Runs alternate (1, 10, 1, 10, …) so drift of
# the machine hits both alike; each is a closed loop (the most requests
# per second) and an open loop at half the 1-bucket maximum (latency).
# Results go to target/benchmarks-buckets/ and a markdown table is printed.
#
# Usage: scripts/benchmark-buckets.sh   (DURATION=10s, ROUNDS=2 by default;
#        STORES="embedded postgres" by default)
# Needs: a PostgreSQL server (DATABASE_URL, default
# postgres://postgres@127.0.0.1:5432/postgres), psql, python3.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-2}
TENANTS=${TENANTS:-4}
INSTANCES=${INSTANCES:-40}
BASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
OUT=target/benchmarks-buckets
BIN=target/release/tollgate
PORT=${PORT:-50652}
SERVER=http://127.0.0.1:${PORT}
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
PSQL=${PSQL:-psql}
BENCH_URL=$(database_url "$BASE_URL" tollgate_bench_buckets)

build_fresh

run_store() { # store label, serve args…
    local store=$1
    shift
    start_server "$@"
    for round in $(seq 1 "$ROUNDS"); do
        for buckets in 1 10; do
            bench "$store-b$buckets-max-$round" --buckets "$buckets"
        done
    done
    local half
    half=$(rate_of "$OUT/$store-b1-max-1.json")
    for round in $(seq 1 "$ROUNDS"); do
        for buckets in 1 10; do
            bench "$store-b$buckets-half-$round" --buckets "$buckets" --rate "$half"
        done
    done
    stop_server
}

STORES=${STORES:-embedded postgres}
for store in $STORES; do
    case $store in
    embedded) run_store embedded --store "$OUT/embedded.redb" --create ;;
    postgres)
        "$PSQL" -q "$BASE_URL" -c "DROP DATABASE IF EXISTS tollgate_bench_buckets WITH (FORCE)" \
            -c "CREATE DATABASE tollgate_bench_buckets"
        run_store postgres --store "$BENCH_URL"
        "$PSQL" -q "$BASE_URL" -c "DROP DATABASE IF EXISTS tollgate_bench_buckets WITH (FORCE)"
        ;;
    *) echo "unknown store $store (embedded, postgres)" >&2; exit 2 ;;
    esac
done

python3 - "$OUT" "$ROUNDS" "$STORES" <<'PY'
import json, statistics, sys
out, rounds, stores = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def load(name):
    return json.load(open(f"{out}/{name}.json"))
print("| store | buckets/tenant | max requests/s (median) | ratio | p50 / p99 at half load, ms | errors |")
print("|---|---|---|---|---|---|")
for store in stores:
    base = None
    for b in [1, 10]:
        maxes = [load(f"{store}-b{b}-max-{r}") for r in range(1, rounds + 1)]
        halves = [load(f"{store}-b{b}-half-{r}") for r in range(1, rounds + 1)]
        rps = statistics.median(m["requests_per_second"] for m in maxes)
        base = base or rps
        p50 = statistics.median(h["latency_us"]["p50"] for h in halves) / 1000
        p99 = statistics.median(h["latency_us"]["p99"] for h in halves) / 1000
        errors = sum(sum(m["total"]["errors"].values()) for m in maxes + halves)
        runs = ", ".join(format(m["requests_per_second"], ",.0f") for m in maxes)
        print(f"| {store} | {b} | {rps:,.0f} ({runs}) | {rps / base:.3f} | {p50:.2f} / {p99:.2f} | {errors} |")
PY
