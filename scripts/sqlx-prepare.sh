#!/usr/bin/env bash
# The store's statements are checked at build time against offline data
# (crates/store/.sqlx: one file per statement with its parameter and column
# types), so that a build needs no database. This script makes that data
# from the migrations:
#
#   scripts/sqlx-prepare.sh          regenerate crates/store/.sqlx
#   scripts/sqlx-prepare.sh --check  fail if it differs from what the
#                                    migrations and statements give now
#                                    (`make lint` runs this)
#
# It applies migrations/ to a scratch database on the server named by
# THREADLINE_TEST_ADMIN_URL (default the local one), expands the store's
# query macros against it (cargo check, in a target directory of its own so
# the main one stays warm), and drops the database. Needs psql and a
# reachable Postgres (`make services` starts one).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

mode=write
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

say() { printf 'sqlx-prepare: %s\n' "$*"; }
die() { printf 'sqlx-prepare: FAIL: %s\n' "$*" >&2; exit 1; }

command -v psql >/dev/null || die "psql not found (Debian: apt-get install postgresql-client)"
admin="${THREADLINE_TEST_ADMIN_URL:-postgres://postgres@127.0.0.1:${TL_PG_PORT:-5432}/postgres}"
db="threadline_sqlx_prepare_$$"
url="${admin%/*}/$db"
out="$(mktemp -d)"
cleanup() {
  psql -q "$admin" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$out"
}
trap cleanup EXIT

psql -q "$admin" -c "CREATE DATABASE $db" >/dev/null \
  || die "cannot create a scratch database on $admin"
for m in migrations/*.sql; do
  psql -q -v ON_ERROR_STOP=1 "$url" -f "$m" >/dev/null || die "applying $m"
done
# The benches read pg_stat_statements (crates/store/src/testing/server.rs):
# the view must exist for their statements to check. Creating it needs no
# preload; reading it does, which only the benches' private server has.
psql -q -v ON_ERROR_STOP=1 "$url" -c 'CREATE EXTENSION IF NOT EXISTS pg_stat_statements' >/dev/null \
  || die "cannot create pg_stat_statements in the scratch database (it ships with Postgres' contrib)"

# Online expansion writes each statement's data into SQLX_OFFLINE_DIR. Only
# the store crate is rebuilt (its own target directory keeps the
# dependencies between runs).
target="${CARGO_TARGET_DIR:-$root/target}/sqlx-prepare"
CARGO_TARGET_DIR="$target" cargo clean -p threadline-store >/dev/null 2>&1 || true
SQLX_OFFLINE=false DATABASE_URL="$url" SQLX_OFFLINE_DIR="$out" CARGO_TARGET_DIR="$target" \
  cargo check --quiet -p threadline-store --features testing \
  || die "the store's statements do not check against the migrations (see the errors above)"

committed="crates/store/.sqlx"
if [[ "$mode" == check ]]; then
  if ! diff -r -q "$committed" "$out" >/dev/null; then
    diff -r -q "$committed" "$out" >&2 || true
    die "$committed does not match the migrations and statements: run scripts/sqlx-prepare.sh and commit the result"
  fi
  say "offline data matches ($(ls "$out" | wc -l) statements)"
else
  rm -rf "$committed"
  mkdir -p "$committed"
  cp "$out"/query-*.json "$committed"/
  say "wrote $(ls "$committed" | wc -l) statements to $committed"
fi
