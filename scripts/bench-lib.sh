# Functions shared by the benchmark scripts, which set OUT, BIN, PORT,
# SERVER, TENANTS, INSTANCES and DURATION (and WARMUP, default 2s;
# METRICS_LISTEN, default
# off; SERVER_BIN, default BIN, is the server's binary; BENCH_CPU, default
# none, the CPU the load generator is kept on) before calling
# them: build the
# release binary, start and stop `tollgate serve`, run `tollgate bench`.

# A fresh store of kind $1 (embedded or postgres), its schema made by the
# binary $2 (default SERVER_BIN, else BIN): prints the serve arguments.
# PostgreSQL needs PSQL, BASE_URL, DB (the database, dropped and made
# again) and BENCH_URL (its URL).
fresh_store() {
    case $1 in
    embedded)
        rm -f "$OUT/embedded.redb"
        echo "--store $OUT/embedded.redb --create"
        ;;
    postgres)
        "$PSQL" -q "$BASE_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >&2
        RUST_LOG=warn "${2:-${SERVER_BIN:-$BIN}}" migrate --store "$BENCH_URL" >/dev/null
        echo "--store $BENCH_URL"
        ;;
    *) echo "unknown store $1 (embedded, postgres)" >&2; exit 2 ;;
    esac
}

# A database on the same server as URL $1, named $2.
database_url() {
    python3 -c 'import sys, urllib.parse as u; p = u.urlsplit(sys.argv[1]); print(u.urlunsplit(p._replace(path="/" + sys.argv[2])))' "$1" "$2"
}

# Empties $OUT and builds the release binary.
build_fresh() {
    rm -rf "$OUT" && mkdir -p "$OUT"
    echo "==> building"
    cargo build --release --locked -q -p tollgate
}

server_pid=""
stop_server() {
    if [[ -n "$server_pid" ]]; then
        kill -TERM "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        server_pid=""
    fi
}
trap stop_server EXIT

start_server() {
    RUST_LOG=warn "${SERVER_BIN:-$BIN}" serve --listen "127.0.0.1:${PORT}" --metrics-listen "${METRICS_LISTEN:-off}" "$@" 2>>"$OUT/server.log" &
    server_pid=$!
    wait_for_server
}

# Waits until the server at $SERVER answers (for up to 10 s), else exits.
wait_for_server() {
    for _ in $(seq 1 100); do
        if TOLLGATE_SERVER=$SERVER "$BIN" tenant list >/dev/null 2>&1; then return; fi
        sleep 0.1
    done
    echo "the server did not start; see $OUT/server.log" >&2
    exit 1
}

bench() { # label, extra bench args…
    local label=$1
    shift
    echo "==> $label"
    ${BENCH_CPU:+taskset -c "$BENCH_CPU"} "$BIN" bench --server "$SERVER" --tenants "$TENANTS" --instances-per-tenant "$INSTANCES" \
        --duration "$DURATION" --warmup "${WARMUP:-2s}" --json "$@" >"$OUT/$label.json"
}

rate_of() { python3 -c 'import json, sys; print(int(json.load(open(sys.argv[1]))["requests_per_second"] / 2))' "$1"; }
