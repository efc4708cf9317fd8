#!/usr/bin/env bash
# Measures the token-bucket path on this machine, in one run:
#   - the embedded store and the PostgreSQL store, through `tollgate serve`
#     and `tollgate bench` (64 pods of 4 tenants): the most requests/s
#     (closed loop), then latency at half that rate (open loop);
#   - the PostgreSQL store serving one request per transaction
#     (`--pg-max-batch 1`), the same shape pgbench runs;
#   - pgbench running that transaction (sql/pgbench/token_bucket.sql) on
#     the same database, with 64 and 16 clients, and at half its max rate.
# Results go to target/benchmarks/ (one JSON per run, pgbench logs) and a
# markdown table is printed at the end.
#
# Usage: scripts/benchmark.sh            (DURATION=20s by default)
#        DATABASE_URL=postgres://user@host/db scripts/benchmark.sh
# Needs: a PostgreSQL server (DATABASE_URL names a database on it to connect
# to; default postgres://postgres@127.0.0.1:5432/postgres), pgbench, psql,
# python3 (for the summary).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-20s}
TENANTS=${TENANTS:-4}
INSTANCES=${INSTANCES:-16}
BASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
OUT=target/benchmarks
BIN=target/release/tollgate
PORT=${PORT:-50651}
SERVER=http://127.0.0.1:${PORT}
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

pg_bindir() {
    if command -v pg_config >/dev/null 2>&1; then pg_config --bindir; return; fi
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}
PGBIN=$(pg_bindir)
PGBENCH=${PGBENCH:-${PGBIN}/pgbench}
PSQL=${PSQL:-$(command -v psql || echo "${PGBIN}/psql")}
# The benchmark database, on the same server as DATABASE_URL.
BENCH_URL=$(database_url "$BASE_URL" tollgate_bench)

build_fresh

fresh_database() {
    "$PSQL" -q "$BASE_URL" -c "DROP DATABASE IF EXISTS tollgate_bench WITH (FORCE)" -c "CREATE DATABASE tollgate_bench"
    "$BIN" migrate --store "$BENCH_URL" >/dev/null
}

# The embedded store.
start_server --store "$OUT/embedded.redb" --create
bench embedded-max
bench embedded-half --rate "$(rate_of "$OUT/embedded-max.json")"
stop_server

# The PostgreSQL store, batched (the default) and one request per transaction.
fresh_database
start_server --store "$BENCH_URL"
bench postgres-max
bench postgres-half --rate "$(rate_of "$OUT/postgres-max.json")"
stop_server
start_server --store "$BENCH_URL" --pg-max-batch 1
bench postgres-unbatched-max
stop_server

# pgbench: the same transaction, on the same database.
pgbench_run() { # label, pgbench args…
    local label=$1
    shift
    echo "==> $label"
    mkdir -p "$OUT/$label"
    "$PGBENCH" -n -M prepared -D "tenants=$TENANTS" -D "instances=$INSTANCES" \
        -f sql/pgbench/token_bucket.sql -j 2 -T "${DURATION%s}" \
        -l --log-prefix="$OUT/$label/log" "$@" "$BENCH_URL" >"$OUT/$label/summary.txt" 2>&1
}
fresh_database
"$PSQL" -q "$BENCH_URL" -v tenants="$TENANTS" -v instances="$INSTANCES" -f sql/pgbench/setup.sql
pgbench_run pgbench-c64 -c $((TENANTS * INSTANCES))
pgbench_run pgbench-c16 -c 16
max_tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$OUT/pgbench-c64/summary.txt" | cut -d. -f1)
pgbench_run pgbench-c64-half -c $((TENANTS * INSTANCES)) -R $((max_tps / 2))

python3 - "$OUT" <<'PY'
import glob, json, os, re, sys

out = sys.argv[1]

def ms(us):
    return f"{us / 1000:.2f}"

rows = []
for label, what in [
    ("embedded-max", "Embedded store, closed loop (max)"),
    ("embedded-half", "Embedded store, open loop at half the max"),
    ("postgres-max", "PostgreSQL store, closed loop (max)"),
    ("postgres-half", "PostgreSQL store, open loop at half the max"),
    ("postgres-unbatched-max", "PostgreSQL store, one request per transaction, closed loop"),
]:
    r = json.load(open(os.path.join(out, label + ".json")))
    l = r["latency_us"]
    errors = sum(r["total"]["errors"].values()) + sum(r["total"]["retried"].values())
    rows.append((what, f"{r['requests_per_second']:.0f}", ms(l["p50"]), ms(l["p99"]), ms(l["max"]), str(errors)))

for label, what in [
    ("pgbench-c64", "pgbench, same transaction, 64 clients (max)"),
    ("pgbench-c16", "pgbench, same transaction, 16 clients"),
    ("pgbench-c64-half", "pgbench, 64 clients at half its max rate"),
]:
    summary = open(os.path.join(out, label, "summary.txt")).read()
    tps = float(re.search(r"^tps = ([0-9.]+)", summary, re.M).group(1))
    failed = re.search(r"number of failed transactions: (\d+)", summary)
    lat = []
    for path in glob.glob(os.path.join(out, label, "log*")):
        with open(path) as f:
            for line in f:
                parts = line.split()
                # client, transaction, latency (us), script, epoch s, epoch us[, lag]
                lat.append(int(parts[2]))
    lat.sort()
    pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
    rows.append((what, f"{tps:.0f}", ms(pct(0.5)), ms(pct(0.99)), ms(lat[-1]), failed.group(1) if failed else "?"))

print()
print("| Run | requests/s | p50 ms | p99 ms | max ms | errors |")
print("|---|---:|---:|---:|---:|---:|")
for row in rows:
    print("| " + " | ".join(row) + " |")
PY
