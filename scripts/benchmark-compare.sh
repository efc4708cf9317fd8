#!/usr/bin/env bash
# Compares the server built from another commit with the one built from
# this tree, in one run, on both stores: the token-bucket load of
# scripts/benchmark.sh (64 pods of 4 tenants, closed loop) and the per-key
# load of scripts/benchmark-checks.sh (one tenant, a million keys, 90 % of
# calls on the 1 000 hottest, closed loop at CHECK_CALLERS callers).
#
# The two servers take turns, round after round (old then new, then new
# then old, ...), each on a fresh store migrated by its own binary, so a
# slow minute on the shared host falls on both. The load generator is
# this tree's `tollgate bench` for both. The spread between rounds of the
# same server is printed beside the ratio: a ratio inside it is noise.
#
# Usage: scripts/benchmark-compare.sh OLD_REF
#        (ROUNDS=3, DURATION=10s, CHECK_CALLERS=256, STORES="embedded postgres")
# Needs: git, a PostgreSQL server (DATABASE_URL, default
# postgres://postgres@127.0.0.1:5432/postgres), psql, python3.
# Results go to target/benchmarks-compare/ (one JSON per run).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -ne 1 ]]; then
    echo "usage: $0 OLD_REF   (a commit, branch or tag to compare this tree with)" >&2
    exit 2
fi
OLD_REF=$1
OLD_COMMIT=$(git rev-parse --verify --quiet "$OLD_REF^{commit}") || {
    echo "$OLD_REF is not a commit in this repository" >&2
    exit 2
}

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
CHECK_CALLERS=${CHECK_CALLERS:-256}
STORES=${STORES:-embedded postgres}
BASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
OUT=target/benchmarks-compare
BIN=target/release/tollgate
PORT=${PORT:-50655}
SERVER=http://127.0.0.1:${PORT}
TENANTS=4
INSTANCES=16
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
PSQL=${PSQL:-psql}
DB=tollgate_bench_compare
BENCH_URL=$(database_url "$BASE_URL" "$DB")
CHECKS=(--checks --keys 1000000 --hot-keys 1000 --hot-fraction 0.9 --key-rate 1 --key-burst 10)

rm -rf "$OUT" && mkdir -p "$OUT"

# The old server builds in a target directory of its own (cargo tells
# workspace crates apart by name, not by source path, so two trees sharing
# one directory overwrite each other's), seeded once with a copy of this
# tree's release build so that dependencies are not built again.
OLD_SRC=target/compare-src
OLD_TARGET=target/compare-target
OLD_BIN=$OUT/tollgate-${OLD_COMMIT:0:10}
echo "==> building ${OLD_COMMIT:0:10} ($OLD_REF)"
git worktree remove --force "$OLD_SRC" 2>/dev/null || rm -rf "$OLD_SRC"
git worktree prune
git worktree add --detach --quiet "$OLD_SRC" "$OLD_COMMIT"
cleanup_worktree() { git worktree remove --force "$OLD_SRC" 2>/dev/null || true; }
trap 'stop_server; cleanup_worktree' EXIT
if [[ ! -d $OLD_TARGET/release && -d target/release ]]; then
    mkdir -p "$OLD_TARGET" && cp -a target/release "$OLD_TARGET/"
fi
(cd "$OLD_SRC" && CARGO_TARGET_DIR="$PWD/../../$OLD_TARGET" cargo build --release --locked -q -p tollgate)
cp "$OLD_TARGET/release/tollgate" "$OLD_BIN"
echo "==> building this tree"
cargo build --release --locked -q -p tollgate
NEW_BIN=$OUT/tollgate-new
cp "$BIN" "$NEW_BIN"

run_one() { # which (old|new), store, round
    local which=$1 store=$2 round=$3 server_bin args
    if [[ $which == old ]]; then server_bin=$OLD_BIN; else server_bin=$NEW_BIN; fi
    # shellcheck disable=SC2207
    args=($(fresh_store "$store" "$server_bin"))
    SERVER_BIN=$server_bin start_server "${args[@]}"
    bench "$store-tokens-$which-r$round"
    stop_server
    # shellcheck disable=SC2207
    args=($(fresh_store "$store" "$server_bin"))
    SERVER_BIN=$server_bin start_server "${args[@]}"
    TENANTS=1 INSTANCES=$CHECK_CALLERS bench "$store-checks-$which-r$round" "${CHECKS[@]}"
    stop_server
}

for round in $(seq 1 "$ROUNDS"); do
    if (( round % 2 )); then order="old new"; else order="new old"; fi
    for which in $order; do
        for store in $STORES; do
            echo "==> round $round/$ROUNDS: $which server, $store store"
            run_one "$which" "$store" "$round"
        done
    done
done
if [[ " $STORES " == *" postgres "* ]]; then
    "$PSQL" -q "$BASE_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)"
fi

python3 - "$OUT" "$ROUNDS" "$STORES" "${OLD_COMMIT:0:10}" "$(git rev-parse --short=10 HEAD)" <<'PY'
import json, statistics, sys
out, rounds, stores, old, new = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4], sys.argv[5]
def rate(name):
    r = json.load(open(f"{out}/{name}.json"))
    errors = sum(r["total"]["errors"].values()) if "total" in r else sum(r.get("errors", {}).values())
    return r["checks_per_second"] if "-checks-" in name else r["requests_per_second"], errors
print(f"\nold = {old}, new = {new} (this tree); {rounds} rounds each, alternating\n")
print("| load | store | old, per round | new, per round | new / old (medians) | spread between rounds |")
print("|---|---|---|---|---:|---:|")
for load, unit in [("tokens", "requests/s"), ("checks", "checks/s")]:
    for store in stores:
        runs = {w: [rate(f"{store}-{load}-{w}-r{i}") for i in range(1, rounds + 1)] for w in ("old", "new")}
        med = {w: statistics.median(v for v, _ in runs[w]) for w in runs}
        spread = max((max(v for v, _ in runs[w]) - min(v for v, _ in runs[w])) / med[w] for w in runs)
        errors = sum(e for w in runs for _, e in runs[w])
        fmt = lambda w: ", ".join(f"{v:,.0f}" for v, _ in runs[w])
        note = f" ({errors} errors)" if errors else ""
        print(f"| {load} ({unit}) | {store} | {fmt('old')} | {fmt('new')} | {med['new'] / med['old']:.3f}{note} | {spread * 100:.1f} % |")
PY
