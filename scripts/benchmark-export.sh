#!/usr/bin/env bash
# How long `tollgate export` and `tollgate import` take on a populated
# store, and how large the export is: TENANTS tenants × INSTANCES pods (one
# instance row each) on the embedded store, then
#   1. export the embedded file (server stopped),
#   2. import into a fresh PostgreSQL database,
#   3. export PostgreSQL,
#   4. import that into a fresh embedded file,
# each timed, and the two exports' bodies compared (all but the header
# line, which names the store and its clock): they must be equal.
#
# Usage: scripts/benchmark-export.sh   (TENANTS=20000 INSTANCES=10)
# Needs: a PostgreSQL server (default
# postgres://postgres@127.0.0.1:5432/postgres) and psql.
set -euo pipefail
cd "$(dirname "$0")/.."

TENANTS=${TENANTS:-20000}
INSTANCES=${INSTANCES:-10}
POPULATE_RATE=${POPULATE_RATE:-4000}
BASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
OUT=target/benchmarks/export
BIN=${BIN:-target/release/tollgate}
PORT=${PORT:-50673}
SERVER=http://127.0.0.1:${PORT}
DURATION=0s
PSQL=${PSQL:-psql}
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
DB_URL=$(database_url "$BASE_URL" tollgate_export)

build_fresh
"$PSQL" -q "$BASE_URL" -c "DROP DATABASE IF EXISTS tollgate_export" -c "CREATE DATABASE tollgate_export"

start_server --store "$OUT/first.redb" --create --inactivity-timeout 1h
populate_seconds=$(( TENANTS * INSTANCES / POPULATE_RATE ))
echo "==> populating: $TENANTS tenants × $INSTANCES pods"
"$BIN" bench --server "$SERVER" --tenants "$TENANTS" --instances-per-tenant "$INSTANCES" \
    --rate "$POPULATE_RATE" --duration "${populate_seconds}s" --warmup 0s --json \
    --tenant-prefix export >"$OUT/populate.json"
stop_server

timed() { # label, command…
    local label=$1
    shift
    local start end
    start=$(date +%s.%N)
    RUST_LOG=warn "$@" 2>>"$OUT/commands.log" >/dev/null
    end=$(date +%s.%N)
    echo "$label: $(python3 -c "print(round($end - $start, 2))") s" | tee -a "$OUT/times.txt"
}

: >"$OUT/times.txt"
timed "export embedded" "$BIN" export --store "$OUT/first.redb" --out "$OUT/first.jsonl"
timed "import into PostgreSQL" "$BIN" import --store "$DB_URL" "$OUT/first.jsonl"
timed "export PostgreSQL" "$BIN" export --store "$DB_URL" --out "$OUT/second.jsonl"
timed "import into embedded" "$BIN" import --store "$OUT/second.redb" "$OUT/second.jsonl"

echo "lines: $(wc -l <"$OUT/first.jsonl"), export: $(stat -c %s "$OUT/first.jsonl") bytes, embedded file: $(stat -c %s "$OUT/first.redb") bytes" | tee -a "$OUT/times.txt"
if cmp -s <(tail -n +2 "$OUT/first.jsonl") <(tail -n +2 "$OUT/second.jsonl"); then
    echo "the two exports are the same after their headers" | tee -a "$OUT/times.txt"
else
    echo "the two exports differ" | tee -a "$OUT/times.txt"
    exit 1
fi
