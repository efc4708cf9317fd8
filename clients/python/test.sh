#!/usr/bin/env bash
# Tests of the Python client against a real server and agent.
#
#   clients/python/test.sh [PYTEST_ARGS...]
#
# Makes (or reuses) a virtual environment under
# ${TOLLGATE_CACHE:-$HOME/.cache/tollgate}/python-venv, installs the package
# with its `test` extra into it, and runs pytest verbosely; the exit status
# is pytest's. TOLLGATE_BIN names the tollgate binary the tests start
# (`tollgate serve`, `tollgate agent`); unset, it is built with
# `cargo build -p tollgate` at the repository's root and
# target/debug/tollgate is used. PYTHON chooses the interpreter that makes
# the environment (default: python3, 3.9 or newer). With
# TOLLGATE_CLIENTS_PREPARED=1 (set by scripts/test.sh, which installed the
# package already, and whose other tests use it meanwhile) nothing is
# installed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${TOLLGATE_CACHE:-$HOME/.cache/tollgate}"
venv="$cache/python-venv"
python="${PYTHON:-python3}"

if [ -z "${TOLLGATE_BIN:-}" ]; then
  echo "test.sh: TOLLGATE_BIN is unset: building it with cargo build -p tollgate" >&2
  (cd "$root" && cargo build -p tollgate)
  TOLLGATE_BIN="$root/target/debug/tollgate"
fi
TOLLGATE_BIN="$(cd "$(dirname "$TOLLGATE_BIN")" && pwd)/$(basename "$TOLLGATE_BIN")"
export TOLLGATE_BIN

if [ "${TOLLGATE_CLIENTS_PREPARED:-}" != 1 ]; then
  if [ ! -x "$venv/bin/python" ]; then
    mkdir -p "$cache"
    "$python" -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$here[test]"
fi

cd "$here"
set +e
"$venv/bin/python" -m pytest -v "$@"
status=$?
set -e
exit "$status"
