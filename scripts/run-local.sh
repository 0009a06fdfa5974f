#!/usr/bin/env bash
# make run: threadline on this machine. Starts Postgres and NATS if they are
# not reachable, creates and migrates the `threadline` database, registers a
# development installation (app A0DEV, team T0DEV) and runs the gateway on
# THREADLINE_GATEWAY_ADDR (default 127.0.0.1:3000) and the context-builder
# (health on 127.0.0.1:3001) until Ctrl-C.
# Development secrets are generated once into .dev/ (git-ignored).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
"$root/scripts/services.sh" up
trap '"$root/scripts/services.sh" down' EXIT

pg_port="${TL_PG_PORT:-5432}"
admin="postgres://postgres@127.0.0.1:$pg_port/postgres"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:$pg_port/threadline}"
export NATS_URL="${NATS_URL:-nats://127.0.0.1:${TL_NATS_PORT:-4222}}"
export THREADLINE_LOG_FORMAT="${THREADLINE_LOG_FORMAT:-text}"
mkdir -p .dev
[ -s .dev/signing-secret ] || head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >.dev/signing-secret
export SLACK_SIGNING_SECRET="${SLACK_SIGNING_SECRET:-$(cat .dev/signing-secret)}"

cargo build -q -p threadline-cli -p threadline-gateway -p threadline-context-builder -p threadline-inference -p threadline-publisher
bin="${CARGO_TARGET_DIR:-$root/target}/debug"
[ -s .dev/token-keys ] || "$bin/threadline" keys generate --id dev >.dev/token-keys
export THREADLINE_TOKEN_KEYS="${THREADLINE_TOKEN_KEYS:-$(cat .dev/token-keys)}"

db="$(basename "${DATABASE_URL%%\?*}")"
psql -q "$admin" -tc "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1 \
  || psql -q "$admin" -c "CREATE DATABASE \"$db\""
"$bin/threadline" migrate
"$bin/threadline" install add --team T0DEV --app A0DEV --bot-user U0DEVBOT --bot-id B0DEVBOT \
  --token xoxb-local-development-only --scopes app_mentions:read,channels:history,chat:write

echo "signing secret for local deliveries: .dev/signing-secret (see README: 'Send a signed event')"
"$bin/threadline-context-builder" &
cb=$!
"$bin/threadline-inference" &
inf=$!
"$bin/threadline-publisher" &
pub=$!
trap 'kill "$cb" "$inf" "$pub" 2>/dev/null; wait "$cb" "$inf" "$pub" 2>/dev/null; "$root/scripts/services.sh" down' EXIT
"$bin/threadline-gateway"
