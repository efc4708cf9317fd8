#!/usr/bin/env bash
# Measures per-key checks (`KeyLimits/Check`), one token of one key per
# call, keys drawn from a million per tenant with 90 % of calls on the
# 1 000 hottest:
#   - Tollgate on PostgreSQL: closed loop at each caller count in CALLERS
#     (the best is the maximum), then open loop at half that maximum
#     (latency), then the keys the store holds right after the load and
#     once it has gone idle (read from /metrics, which this server reads
#     from the store at every scrape rather than every 30 s, so the second
#     figure shows the sweep);
#   - the same on the embedded store;
#   - pgbench on the same PostgreSQL, one call per transaction under
#     SERIALIZABLE with retries, at each client count in CLIENTS: the
#     article's function (sql/pgbench/seed_function.sql) and Tollgate's own
#     (sql/functions/take_tokens.sql); then the article's function at half
#     its best rate (`pgbench -R`, latency per transaction from its log), the
#     latency its callers would see on the same database at the same load.
# Results go to target/benchmarks-checks/ and a markdown table is printed.
#
# Usage: scripts/benchmark-checks.sh   (DURATION=10s; CALLERS="16 64 256 1024";
#        CLIENTS="1 4 8 16 32 64"; STORES="postgres embedded")
# Needs: a PostgreSQL server (DATABASE_URL, default
# postgres://postgres@127.0.0.1:5432/postgres), psql, pgbench, python3.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
CALLERS=${CALLERS:-16 64 256 1024}
CLIENTS=${CLIENTS:-1 4 8 16 32 64}
STORES=${STORES:-postgres embedded}
TENANTS=1
INSTANCES=16
BASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
OUT=target/benchmarks-checks
BIN=target/release/tollgate
PORT=${PORT:-50653}
METRICS_PORT=${METRICS_PORT:-50654}
METRICS_LISTEN=127.0.0.1:${METRICS_PORT}
SERVER=http://127.0.0.1:${PORT}
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
PSQL=${PSQL:-psql}
PGBENCH=${PGBENCH:-pgbench}
DB=tollgate_bench_checks
BENCH_URL=$(database_url "$BASE_URL" "$DB")
CHECKS=(--checks --keys 1000000 --hot-keys 1000 --hot-fraction 0.9 --key-rate 1 --key-burst 10)

build_fresh

stored_keys() {
    curl -sf "http://${METRICS_LISTEN}/metrics" | awk '$1 == "tollgate_stored_keys" { print $2 }'
}

run_store() { # store, serve args…
    local store=$1
    shift
    # tollgate_stored_keys fresh at each scrape: with the default 30 s
    # snapshot the idle reading would repeat the one after the load.
    start_server --metrics-store-read-interval 0s "$@"
    for callers in $CALLERS; do
        INSTANCES=$callers bench "$store-max-c$callers" "${CHECKS[@]}"
    done
    local best
    best=$(python3 - "$OUT" "$store" $CALLERS <<'PY'
import json, sys
out, store, callers = sys.argv[1], sys.argv[2], sys.argv[3:]
runs = [(json.load(open(f"{out}/{store}-max-c{c}.json"))["checks_per_second"], c) for c in callers]
print(max(runs)[1])
PY
)
    local half
    half=$(python3 -c 'import json, sys; print(int(json.load(open(sys.argv[1]))["checks_per_second"] / 2))' "$OUT/$store-max-c$best.json")
    INSTANCES=$best bench "$store-half" "${CHECKS[@]}" --rate "$half"
    stored_keys >"$OUT/$store-keys-after-load.txt"
    # A key takes at most 10 s to refill (burst 10 at 1/s); the sweep
    # runs every second.
    sleep 15
    stored_keys >"$OUT/$store-keys-idle.txt"
    stop_server
}

pgbench_once() { # clients, script, output file, extra pgbench args…
    local clients=$1 script=$2 out=$3
    shift 3
    PGOPTIONS='-c default_transaction_isolation=serializable' \
        "$PGBENCH" -n -M prepared --max-tries=100 -c "$clients" -j "$(( clients < 2 ? 1 : 2 ))" \
        -T "${DURATION%s}" -D keys=1000000 -D hot_keys=1000 -D hot_percent=90 "$@" \
        -f "$script" "$BENCH_URL" >"$out" 2>&1
}

pgbench_run() { # label, script
    local label=$1 script=$2
    for clients in $CLIENTS; do
        echo "==> pgbench $label, $clients clients"
        pgbench_once "$clients" "$script" "$OUT/pgbench-$label-c$clients.txt"
    done
}

best_clients() { # label: the client count with the most tps
    python3 - "$OUT" "$1" $CLIENTS <<'PY'
import re, sys
out, label, clients = sys.argv[1], sys.argv[2], sys.argv[3:]
def tps(c):
    m = re.search(r"tps = ([0-9.]+)", open(f"{out}/pgbench-{label}-c{c}.txt").read())
    return float(m.group(1)) if m else 0.0
best = max(clients, key=tps)
print(best, int(tps(best) / 2))
PY
}

pgbench_half() { # label, script: open loop at half the best rate, per-transaction log
    local label=$1 script=$2 clients rate
    read -r clients rate < <(best_clients "$label")
    echo "==> pgbench $label at half its best: $clients clients, $rate/s"
    rm -rf "$OUT/pgbench-log" && mkdir -p "$OUT/pgbench-log"
    pgbench_once "$clients" "$script" "$OUT/pgbench-$label-half.txt" \
        -R "$rate" -l --log-prefix="$OUT/pgbench-log/pgbench_log"
    # Per transaction: client, number, latency µs, script, epoch s, µs,
    # schedule lag µs, retries. Latency plus lag counts from the scheduled
    # start, as the bench's open loop does. A transaction that failed after
    # its retries has `failed` for its latency: counted apart.
    cat "$OUT"/pgbench-log/pgbench_log.* | python3 -c '
import sys
rows = [line.split() for line in sys.stdin]
lat = sorted(int(f[2]) + int(f[6]) for f in rows if len(f) > 6 and f[2].isdigit())
failed = sum(1 for f in rows if len(f) > 6 and f[2] == "failed")
pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] / 1000
print(f"{pick(0.5):.2f} / {pick(0.99):.2f} (at {sys.argv[1]}/s, {failed} failed)")' "$rate" >"$OUT/pgbench-$label-half-latency.txt"
}

for store in $STORES; do
    case $store in
    postgres)
        "$PSQL" -q "$BASE_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
        run_store postgres --store "$BENCH_URL"
        "$PSQL" -q "$BENCH_URL" -f sql/pgbench/seed_function.sql -f sql/functions/take_tokens.sql
        pgbench_run seed sql/pgbench/check_seed.sql
        pgbench_run ours sql/pgbench/check_ours.sql
        pgbench_half seed sql/pgbench/check_seed.sql
        "$PSQL" -q "$BASE_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)"
        ;;
    embedded) run_store embedded --store "$OUT/embedded.redb" --create ;;
    *) echo "unknown store $store (postgres, embedded)" >&2; exit 2 ;;
    esac
done

python3 - "$OUT" "$STORES" "$CALLERS" "$CLIENTS" <<'PY'
import json, os, re, sys
out, stores, callers, clients = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4].split()
def load(name):
    return json.load(open(f"{out}/{name}.json"))
def read(name):
    path = f"{out}/{name}"
    return open(path).read().strip() if os.path.exists(path) else "?"
print("| what | best checks/s (per caller count) | p50 / p99 at half load, ms | errors | keys stored after load / idle |")
print("|---|---|---|---|---|")
best = {}
for store in stores:
    runs = {c: load(f"{store}-max-c{c}") for c in callers}
    top = max(r["checks_per_second"] for r in runs.values())
    best[store] = top
    half = load(f"{store}-half")
    errors = sum(sum(r["errors"].values()) for r in list(runs.values()) + [half])
    each = ", ".join(f"{c}: {r['checks_per_second']:,.0f}" for c, r in runs.items())
    print(f"| Tollgate, {store} store | {top:,.0f} ({each}) | {half['latency_us']['p50']/1000:.2f} / {half['latency_us']['p99']/1000:.2f} | {errors} | {read(store + '-keys-after-load.txt')} / {read(store + '-keys-idle.txt')} |")
if "postgres" in stores:
    for label, name in [("seed", "the article's function"), ("ours", "tollgate_take_tokens")]:
        tps = {}
        failed = {}
        for c in clients:
            text = open(f"{out}/pgbench-{label}-c{c}.txt").read()
            m = re.search(r"tps = ([0-9.]+)", text)
            tps[c] = float(m.group(1)) if m else 0.0
            f = re.search(r"number of failed transactions: (\d+)", text)
            failed[c] = int(f.group(1)) if f else -1
        top = max(tps.values())
        best[label] = top
        each = ", ".join(f"{c}: {v:,.0f}" for c, v in tps.items())
        half = read(f"pgbench-{label}-half-latency.txt") if label == "seed" else ""
        print(f"| pgbench, {name} | {top:,.0f} ({each}) | {half} | {sum(failed.values())} failed | |")
    if best.get("seed"):
        print(f"\nTollgate on PostgreSQL / the article's function at its best: {best['postgres'] / best['seed']:.2f}x")
PY
