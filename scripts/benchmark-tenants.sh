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
#   3b. The reference again with as many pods as the big fleet (4 tenants ×
#      TENANTS×INSTANCES/4 pods, populated the same way) on a fresh store,
#      so that the load generator's own work is the same in both.
#   Around every measured run the server's /metrics is read, for the
#   server's own time (tollgate_rpc_duration_seconds) beside the bench's.
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
#        FLEET_ONLY=1 STORES=postgres POPULATE_RATE=3000 scripts/benchmark-tenants.sh
#          (steps 1 to 6 only: no second server, no 4-tenant reference of
#          as many pods)
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
BIN=${BIN:-target/release/tollgate}
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

metrics_to() { curl -s "http://${METRICS_LISTEN}/metrics" >"$1"; }

measured() { # label, tenants, rate, duration, extra bench args…
    local label=$1
    metrics_to "$OUT/$label.before.prom"
    open_loop "$@"
    metrics_to "$OUT/$label.after.prom"
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
    serve_args=(--store "$location" --create --inactivity-timeout 1h --max-pending-requests 1024)
    start_server "${serve_args[@]}" --metrics-store-read-interval 0s
    measured "$store-4-tenants" 4 "$RATE" "$DURATION" --tenant-prefix small
    populate_seconds=$(( TENANTS * INSTANCES / POPULATE_RATE ))
    open_loop "$store-populate" "$TENANTS" "$POPULATE_RATE" "${populate_seconds}s" --tenant-prefix big
    measured "$store-$TENANTS-tenants" "$TENANTS" "$RATE" "$DURATION" --tenant-prefix big
    echo "$store: server RSS $(rss_kib) KiB, store $(store_bytes "$store" "$location") bytes, $TENANTS tenants × $INSTANCES pods" | tee -a "$OUT/sizes.txt"
    scrape "$store, read at every scrape"
    start=$(date +%s.%N)
    TOLLGATE_SERVER=$SERVER "$BIN" tenant list --json >"$OUT/$store-list.json"
    end=$(date +%s.%N)
    echo "$store: tenant list --json: $(python3 -c "print(round($end - $start, 2))") s, $(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))))' "$OUT/$store-list.json") buckets" | tee -a "$OUT/sizes.txt"
    stop_server
    if [[ -n ${FLEET_ONLY:-} ]]; then continue; fi
    # The same again on a server reading the store at most every 30 s; the
    # fleet's requests first, so that its own per-tenant counters (grants)
    # are as large as the first server's.
    start_server "${serve_args[@]}"
    open_loop "$store-again" "$TENANTS" "$POPULATE_RATE" "${populate_seconds}s" --tenant-prefix big
    scrape "$store, read at most every 30 s"
    stop_server
    # The reference with the big fleet's number of pods, on a fresh store.
    case $store in
    embedded) rm -f "$file" ;;
    postgres) "$PSQL" -q "$BASE_URL" -c "DROP DATABASE IF EXISTS tollgate_tenants" -c "CREATE DATABASE tollgate_tenants" ;;
    esac
    start_server "${serve_args[@]}"
    INSTANCES=$(( TENANTS * INSTANCES / 4 )) open_loop "$store-populate-4" 4 "$POPULATE_RATE" "${populate_seconds}s" --tenant-prefix wide
    INSTANCES=$(( TENANTS * INSTANCES / 4 )) measured "$store-4-tenants-wide" 4 "$RATE" "$DURATION" --tenant-prefix wide
    stop_server
done

python3 - "$OUT" "$STORES" "$TENANTS" "$INSTANCES" <<'PY'
import json, sys
sys.path.insert(0, "scripts")
from prom_text import samples
out, stores, tenants, instances = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4])

def server_quantiles(label):
    """p50 and p99 of the server's TokenBucket time over the run, from the
    histogram's buckets (the upper bound of the bucket each falls in)."""
    def buckets(path):
        found = {}
        for (name, labels), value in samples(path).items():
            l = dict(labels)
            if name == "tollgate_rpc_duration_seconds_bucket" and l.get("method") == "TokenBucket" and l.get("code") == "OK":
                found[float(l["le"])] = value
        return found
    before, after = buckets(f"{out}/{label}.before.prom"), buckets(f"{out}/{label}.after.prom")
    delta = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    total = delta[-1][1] if delta else 0
    def q(p):
        return next((le for le, n in delta if n >= p * total), float("inf")) * 1000
    return q(0.5), q(0.99)

print("\n| store | tenants × pods | rate asked | answered/s | p50 ms | p99 ms | p99.9 ms | attempt p50 / p99 ms | server p50 / p99 ms (≤ bucket) |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for store in stores:
    for label, shape in (("4-tenants", f"4 × {instances}"), (f"{tenants}-tenants", f"{tenants} × {instances}"),
                         ("4-tenants-wide", f"4 × {tenants * instances // 4}")):
        try:
            r = json.load(open(f"{out}/{store}-{label}.json"))
        except FileNotFoundError:
            continue
        l, a = r["latency_us"], r["answered_attempt_latency_us"]
        s50, s99 = server_quantiles(f"{store}-{label}")
        print(f"| {store} | {shape} | {r['target_rate']:.0f} | {r['requests_per_second']:.0f} | {l['p50'] / 1000:.2f} | "
              f"{l['p99'] / 1000:.2f} | {l['p99_9'] / 1000:.2f} | {a['p50'] / 1000:.2f} / {a['p99'] / 1000:.2f} | {s50:g} / {s99:g} |")
PY
cat "$OUT/sizes.txt" "$OUT/scrapes.txt"
