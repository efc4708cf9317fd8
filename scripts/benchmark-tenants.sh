#!/usr/bin/env bash
# 100 000 tenants × 10 pods (10⁶ instance rows) against 4 tenants × 10 pods,
# at the same open-loop rate, on the embedded store and on PostgreSQL; and
# what a /metrics scrape and `tenant list` cost at that size.
#
# For each store (STORES, default "embedded postgres"), on a fresh store:
#   1. 4 tenants × 10 pods, open loop at RATE requests/s for DURATION:
#      latency (the reference).
#   2. Populate: 100 000 tenants × 10 pods, each pod's first request (the
#      instance row is created), open loop at POPULATE_RATE.
#   3. The big fleet, open loop at RATE for DURATION: latency.
#   4. The server's resident memory and the store's size, per tenant.
#   5. /metrics, three scrapes, with the store read at every scrape
#      (--metrics-store-read-interval 0s, how every release before it
#      worked) and then, on a server restarted with the default interval
#      (30 s) and sent the populating requests again, three more: time and
#      bytes of each. A read is TENANTS/1000 list_buckets pages of 1 000.
#   6. `tollgate tenant list --json` (every page) and one page: time.
# The server runs with --inactivity-timeout 1h: at RATE a pod of the big
# fleet asks every TENANTS×INSTANCES/RATE seconds, longer than the default
# 60 s after which a silent pod is removed, and the rows are the point.
#
# Usage: scripts/benchmark-tenants.sh   (RATE=4000 DURATION=20s)
#        STORES=embedded TENANTS=20000 scripts/benchmark-tenants.sh
# Needs: python3, curl; for PostgreSQL, a server (default
# postgres://postgres@127.0.0.1:5432/postgres) and psql.
set -euo pipefail
cd "$(dirname "$0")/.."

STORES=${STORES:-embedded postgres}
TENANTS=${TENANTS:-100000}
INSTANCES=${INSTANCES:-10}
RATE=${RATE:-4000}
POPULATE_RATE=${POPULATE_RATE:-8000}
DURATION=${DURATION:-20s}
BASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
OUT=target/benchmarks/tenants
BIN=target/release/tollgate
PORT=${PORT:-50663}
METRICS_PORT=$((PORT + 1))
METRICS_LISTEN=127.0.0.1:${METRICS_PORT}
SERVER=http://127.0.0.1:${PORT}
PSQL=${PSQL:-psql}
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
BENCH_URL=$(database_url "$BASE_URL" tollgate_tenants)

build_fresh

open_loop() { # label, tenants, rate, duration, extra bench args…
    local label=$1 tenants=$2 rate=$3 duration=$4
    shift 4
    echo "==> $label: $tenants tenants × $INSTANCES pods at $rate/s for $duration"
    "$BIN" bench --server "$SERVER" --tenants "$tenants" --instances-per-tenant "$INSTANCES" \
        --rate "$rate" --duration "$duration" --warmup 2s --json "$@" >"$OUT/$label.json"
}

rss_kib() { awk '/^VmRSS/ { print $2 }' "/proc/$server_pid/status"; }

scrape() { # label
    for i in 1 2 3; do
        curl -s -o /dev/null -w "$1 scrape $i: %{time_total} s, %{size_download} bytes\n" \
            "http://${METRICS_LISTEN}/metrics" | tee -a "$OUT/scrapes.txt"
    done
}

store_bytes() { # store, path or url
    case $1 in
    embedded) stat -c %s "$2" ;;
    postgres) "$PSQL" -qtA "$BASE_URL" -c "SELECT pg_database_size('tollgate_tenants')" ;;
    esac
}

: >"$OUT/scrapes.txt"
: >"$OUT/sizes.txt"
for store in $STORES; do
    case $store in
    embedded)
        file=$OUT/tollgate.redb
        rm -f "$file"
        location=$file
        ;;
    postgres)
        "$PSQL" -q "$BASE_URL" -c "DROP DATABASE IF EXISTS tollgate_tenants" -c "CREATE DATABASE tollgate_tenants"
        location=$BENCH_URL
        ;;
    esac
    serve_args=(--store "$location" --inactivity-timeout 1h --max-pending-requests 1024)
    start_server "${serve_args[@]}" --metrics-store-read-interval 0s
    open_loop "$store-4-tenants" 4 "$RATE" "$DURATION" --tenant-prefix small
    populate_seconds=$(( TENANTS * INSTANCES / POPULATE_RATE ))
    open_loop "$store-populate" "$TENANTS" "$POPULATE_RATE" "${populate_seconds}s" --tenant-prefix big
    open_loop "$store-$TENANTS-tenants" "$TENANTS" "$RATE" "$DURATION" --tenant-prefix big
    echo "$store: server RSS $(rss_kib) KiB, store $(store_bytes "$store" "$location") bytes, $TENANTS tenants × $INSTANCES pods" | tee -a "$OUT/sizes.txt"
    scrape "$store, read at every scrape"
    start=$(date +%s.%N)
    TOLLGATE_SERVER=$SERVER "$BIN" tenant list --json >"$OUT/$store-list.json"
    end=$(date +%s.%N)
    echo "$store: tenant list --json: $(python3 -c "print(round($end - $start, 2))") s, $(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))))' "$OUT/$store-list.json") buckets" | tee -a "$OUT/sizes.txt"
    stop_server
    # The same again on a server reading the store at most every 30 s; the
    # fleet's requests first, so that its own per-tenant counters (grants)
    # are as large as the first server's.
    start_server "${serve_args[@]}"
    open_loop "$store-again" "$TENANTS" "$POPULATE_RATE" "${populate_seconds}s" --tenant-prefix big
    scrape "$store, read at most every 30 s"
    stop_server
done

python3 - "$OUT" "$STORES" "$TENANTS" <<'PY'
import json, sys
out, stores, tenants = sys.argv[1], sys.argv[2].split(), sys.argv[3]
print(f"\n| store | tenants × pods | rate asked | answered/s | p50 ms | p99 ms | p99.9 ms |")
print("|---|---|---:|---:|---:|---:|---:|")
for store in stores:
    for label in ("4-tenants", f"{tenants}-tenants"):
        r = json.load(open(f"{out}/{store}-{label}.json"))
        l = r["latency_us"]
        print(f"| {store} | {label.split('-')[0]} × {r['pods'] // int(label.split('-')[0])} | {r['target_rate']:.0f} | "
              f"{r['requests_per_second']:.0f} | {l['p50'] / 1000:.2f} | {l['p99'] / 1000:.2f} | {l['p99_9'] / 1000:.2f} |")
PY
cat "$OUT/sizes.txt" "$OUT/scrapes.txt"
