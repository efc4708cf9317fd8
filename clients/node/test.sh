#!/usr/bin/env bash
# Installs the package's dependencies as locked, builds it, and runs its
# tests against a real `tollgate serve` and `tollgate agent`.
#
# TOLLGATE_BIN names the tollgate binary; unset, it is built with
# `cargo build -p tollgate` at the repository's root and
# target/debug/tollgate is used. With TOLLGATE_CLIENTS_PREPARED=1 (set by
# scripts/test.sh, which installed and built the package already, and
# whose other tests use it meanwhile) only the tests are compiled. The
# exit status is the tests'.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

if [[ -z "${TOLLGATE_BIN:-}" ]]; then
  export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-0}"
  (cd "$root" && cargo build -p tollgate)
  TOLLGATE_BIN="$root/target/debug/tollgate"
fi
TOLLGATE_BIN="$(cd "$(dirname "$TOLLGATE_BIN")" && pwd)/$(basename "$TOLLGATE_BIN")"
export TOLLGATE_BIN

cd "$here"
if [[ "${TOLLGATE_CLIENTS_PREPARED:-}" != 1 ]]; then
  npm ci --no-audit --no-fund
  npm run build
fi
npm run build:test
exec node --test build/test/*.test.js
