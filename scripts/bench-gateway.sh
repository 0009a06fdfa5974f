#!/usr/bin/env bash
# make bench-gateway: the release gateway against a fresh database with
# durable commits, loaded with signed distinct deliveries at concurrency 64.
# Prints throughput and ack latency (p50/p99/max). Reports figures; asserts none.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}/release"
pg_port="${TL_PG_PORT:-5432}"
nats="${NATS_URL:-nats://127.0.0.1:${TL_NATS_PORT:-4222}}"
db="threadline_bench"
admin="postgres://postgres@127.0.0.1:$pg_port/postgres"
secret="bench-signing-secret-$RANDOM$RANDOM"
prefix="bench$RANDOM"
port="${BENCH_PORT:-3900}"

cargo build --release -q -p threadline-gateway -p threadline-cli -p threadline-bench

psql -q "$admin" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
# Loopback Postgres without TLS: the figure is about the gateway's own work.
export DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/$db?sslmode=disable"
"$target/threadline" migrate >/dev/null
# (the bot token through the environment: no secret on a command line)
THREADLINE_TOKEN_KEYS="$("$target/threadline" keys generate --id bench)" SLACK_BOT_TOKEN=xoxb-bench \
  "$target/threadline" install add --team T0BENCH --app A0BENCH --bot-user U0BOT --bot-id B0BOT >/dev/null
echo "cores: $(nproc); postgres: synchronous_commit=$(psql -tA "$admin" -c 'SHOW synchronous_commit'), fsync=$(psql -tA "$admin" -c 'SHOW fsync')"

SLACK_SIGNING_SECRET="$secret" NATS_URL="$nats" THREADLINE_BUS_PREFIX="$prefix" \
THREADLINE_GATEWAY_ADDR="127.0.0.1:$port" RUST_LOG=warn THREADLINE_AUDIT_KEY="$(printf '5a%.0s' {1..32})" \
  "$target/threadline-gateway" &
gw=$!
cleanup() {
  kill "$gw" 2>/dev/null || true
  wait "$gw" 2>/dev/null || true
  NATS_URL="$nats" "$target/threadline-bench-gateway" --delete-streams "$prefix" || true
  psql -q "$admin" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true
}
trap cleanup EXIT
for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done

SLACK_SIGNING_SECRET="$secret" "$target/threadline-bench-gateway" \
  --url "http://127.0.0.1:$port/slack/events" --concurrency "${BENCH_CONCURRENCY:-64}" --seconds "${BENCH_SECONDS:-20}"
echo "ledger after the run:"
"$target/threadline" stats --json | grep -E '"(receipts_total|duplicate_deliveries_total|outbox_pending|outbox_published_total)"'
