#!/usr/bin/env bash
# What per-key buckets' checks take in the usage history, on both stores:
# BUCKETS buckets × MINUTES minute rows of one replica (each row with its
# five busiest keys, shaped as a server writes them), written as an export
# and loaded with `tollgate import` (the store's own writes) into a new
# embedded file and a new PostgreSQL database. Prints the bytes a row
# takes on each: the file's size as redb leaves it, and the table's with
# its primary key and pruning index.
#
# Usage: scripts/size-check-history.sh   (BUCKETS=1000, MINUTES=200)
# Needs: a PostgreSQL server (DATABASE_URL, default
# postgres://postgres@127.0.0.1:5432/postgres), psql, python3.
set -euo pipefail
cd "$(dirname "$0")/.."

BUCKETS=${BUCKETS:-1000}
MINUTES=${MINUTES:-200}
BASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
OUT=target/size-check-history
DB=tollgate_size_check_history
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
BIN=target/release/tollgate
URL=$(database_url "$BASE_URL" "$DB")

mkdir -p "$OUT"
cargo build --release -q -p tollgate
python3 - "$BUCKETS" "$MINUTES" > "$OUT/export.jsonl" <<'PY'
import json, sys
buckets, minutes = int(sys.argv[1]), int(sys.argv[2])
start = 1_800_000_000 // 60 * 60 * 1_000_000
print(json.dumps({"kind": "header", "format": "tollgate-store-export", "version": 6,
                  "store": "embedded", "exported_at": start}))
rows = 0
for b in range(buckets):
    for m in range(minutes):
        checks = 600 + (b * 7 + m) % 400
        busiest = [{"key": f"user-{(b + m + k) % 5000:07d}", "checks": checks // (2 + k)}
                   for k in range(5)]
        busiest[3]["over"] = 2
        busiest[4]["over"] = 2
        print(json.dumps({"kind": "check_history", "tenant": f"tenant-{b:05d}",
                          "bucket": "per-user", "step_secs": 60, "slot": start + m * 60_000_000,
                          "replica": "5f0c2a9e13b7d864",
                          "counts": {"checks": checks, "refusals": m % 23,
                                     "shadow_refusals": 0, "busiest": busiest}}))
        rows += 1
print(json.dumps({"kind": "end", "tiers": 0, "tenants": 0, "buckets": 0, "instances": 0,
                  "keys": 0, "check_requests": 0, "check_history_rows": rows}))
PY
rows=$((BUCKETS * MINUTES))
rm -f "$OUT/store.redb"
"$BIN" import --store "$OUT/store.redb" "$OUT/export.jsonl"
bytes=$(stat -c %s "$OUT/store.redb")
echo "embedded: $rows rows, $bytes bytes, $((bytes / rows)) bytes a row (the file)"

psql -q "$BASE_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
"$BIN" import --store "$URL" "$OUT/export.jsonl"
psql -q "$URL" -c "VACUUM ANALYZE tollgate_check_history"
psql -qAt "$URL" -c "SELECT 'postgres: ' || count(*) || ' rows, ' || pg_total_relation_size('tollgate_check_history') || ' bytes, ' || (pg_total_relation_size('tollgate_check_history') / greatest(count(*), 1)) || ' bytes a row (with indexes)' FROM tollgate_check_history"
psql -q "$BASE_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)"
