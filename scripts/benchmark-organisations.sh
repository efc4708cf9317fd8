#!/usr/bin/env bash
# What an organisation costs the token-bucket path, in one run, on both
# stores: 1 000 tenants with a pod each (closed loop, `tollgate bench`),
# on their own ("plain"); then the same tenants as the members of one
# organisation whose request-unit bucket never binds ("org": each member
# bucket draws from it once per draw period, 10 s); then the same with
# `--draw-period 0s` ("locked": every pod request draws; since a draw
# skips an organisation row another transaction holds, most of them skip
# it: at commit 302ea7f, before that, this measured every pod request
# locking and writing the organisation's row, the alternative the design
# avoids). The kinds take
# turns, round after round, each on a fresh store; the spread between
# rounds of one kind is printed beside each ratio. After each "org" run,
# the organisation's view says how many draws its members made: at most
# one per member bucket per draw period.
#
# The warmup (12 s) is longer than a draw period, so that what is
# measured is the steady state: every member has drawn at least twice,
# asking for what its pods want (a member's first draw asks for what its
# first requests asked).
#
# On PostgreSQL, each "org" run also prints how many of its transactions
# took a round trip of their own for the organisation's rows
# (`tollgate_store_draw_round_trips_total`), and how many draws were owed
# and made in transactions of their own (`tollgate_store_owed_draws_total`).
#
# Usage: scripts/benchmark-organisations.sh   (ROUNDS=3, DURATION=15s,
#        WARMUP=12s, TENANTS=1000, STORES="embedded postgres",
#        KINDS="plain org locked")
# Needs: a PostgreSQL server (DATABASE_URL, default
# postgres://postgres@127.0.0.1:5432/postgres), psql, python3.
# Results go to target/benchmarks-organisations/ (one JSON per run).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-15s}
WARMUP=${WARMUP:-12s}
STORES=${STORES:-embedded postgres}
KINDS=${KINDS:-plain org locked}
METRICS_PORT=${METRICS_PORT:-50662}
export METRICS_LISTEN=127.0.0.1:${METRICS_PORT}
TENANTS=${TENANTS:-1000}
INSTANCES=1
BASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
OUT=target/benchmarks-organisations
BIN=target/release/tollgate
PORT=${PORT:-50661}
SERVER=http://127.0.0.1:${PORT}
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
PSQL=${PSQL:-psql}
DB=tollgate_bench_organisations
BENCH_URL=$(database_url "$BASE_URL" "$DB")

build_fresh

# One organisation, a bucket that never binds, every bench tenant in it.
organise() {
    local t=(env TOLLGATE_SERVER="$SERVER" "$BIN")
    "${t[@]}" org create --org acme >/dev/null
    "${t[@]}" org set-limits --org acme --available 1e12 --refill-rate 1e12 --burst-limit 1e12 >/dev/null
    seq 0 $((TENANTS - 1)) | xargs -P 8 -I{} env TOLLGATE_SERVER="$SERVER" "$BIN" org add-tenant --org acme --tenant "bench-{}" >/dev/null
}

# Requests refused as overload (none expected: see --max-pending-requests).
refused() {
    python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))["total"]; print("    refused as overload and retried: %d" % t["retried"].get("Unavailable", 0))' "$OUT/$1.json"
}

# Draws per member: the most any member made, and the mean.
draws() {
    TOLLGATE_SERVER=$SERVER "$BIN" org show --org acme --json >"$OUT/$1-org.json"
    python3 - "$OUT/$1-org.json" <<'PY'
import json, sys
org = json.load(open(sys.argv[1]))
draws = [b["draws"] for m in org["members"] for b in m["buckets"]]
print(f"    {len(org['members'])} members: {sum(draws)} draws, at most {max(draws)} by one, mean {sum(draws) / len(draws):.2f}")
PY
}

# The store's transactions, and the draws' own round trips, so far.
round_trips() {
    curl -s "http://$METRICS_LISTEN/metrics" | python3 -c '
import sys
values = {}
for line in sys.stdin:
    name, _, value = line.partition(" ")
    if name in ("tollgate_store_transactions_total", "tollgate_store_draw_round_trips_total", "tollgate_store_owed_draws_total"):
        values[name] = float(value)
t = values.get("tollgate_store_transactions_total", 0)
d = values.get("tollgate_store_draw_round_trips_total", 0)
o = values.get("tollgate_store_owed_draws_total", 0)
print(f"    {t:.0f} transactions, {d:.0f} draw round trips ({100 * d / max(t, 1):.1f} %), {o:.0f} owed draws")'
}

read -r -a kinds <<<"$KINDS"
for round in $(seq 1 "$ROUNDS"); do
    # The kinds take turns: each round starts one further along.
    shift_by=$(((round - 1) % ${#kinds[@]}))
    order=("${kinds[@]:shift_by}" "${kinds[@]:0:shift_by}")
    for kind in "${order[@]}"; do
        for store in $STORES; do
            echo "==> round $round/$ROUNDS: $store store, $kind"
            # shellcheck disable=SC2207
            args=($(fresh_store "$store"))
            # Every pod's request is queued, none refused as overload: a
            # refused request waits out its retry hint (250 ms), and the
            # rate measured would be that of the refusals' rhythm, not of
            # the store (1 000 pods against the default 128 pending).
            args+=(--max-pending-requests $((2 * TENANTS * INSTANCES)))
            if [[ $kind == locked ]]; then args+=(--draw-period 0s); fi
            start_server "${args[@]}"
            if [[ $kind != plain ]]; then organise; fi
            bench "$store-$kind-r$round"
            refused "$store-$kind-r$round"
            if [[ $kind != plain ]]; then draws "$store-$kind-r$round"; fi
            if [[ $kind == org && $store == postgres ]]; then round_trips; fi
            stop_server
        done
    done
done
if [[ " $STORES " == *" postgres "* ]]; then
    "$PSQL" -q "$BASE_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)"
fi

python3 scripts/bench-summary.py "$OUT" "$ROUNDS" "$STORES" plain org "an organisation" requests/s
if [[ " $KINDS " == *" locked "* ]]; then
    python3 scripts/bench-summary.py "$OUT" "$ROUNDS" "$STORES" plain locked "the organisation's row locked per request" requests/s
fi
