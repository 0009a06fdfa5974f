#!/usr/bin/env bash
# Every SQL statement lives in the store crate (crates/store), where it is a
# query macro checked against the schema at build time. This fails when
# Rust code elsewhere builds a statement of its own: a runtime-checked
# `sqlx::query*` call or a raw SQL string handed to sqlx.
set -euo pipefail
cd "$(dirname "$0")/.."
pattern='sqlx::(query|query_as|query_scalar|query_with|query_as_with|query_scalar_with|raw_sql)[[:space:]]*[(!]|\.execute\([[:space:]]*"'
found="$(grep -rnE "$pattern" --include='*.rs' crates tests | grep -v '^crates/store/' || true)"
if [[ -n "$found" ]]; then
  printf '%s\n' "$found" >&2
  echo "sql-outside-store: FAIL: SQL outside crates/store (move it into a store module; tests use threadline_store::testing)" >&2
  exit 1
fi
echo "sql-outside-store: no SQL outside crates/store"
