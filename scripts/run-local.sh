#!/usr/bin/env bash
# make run: threadline against a real Slack app, on this machine.
#
#   SLACK_SIGNING_SECRET=<the app's signing secret> SLACK_BOT_TOKEN=xoxb-… SLACK_APP_ID=A… make run
#
# SLACK_APP_ID (the app's Basic Information page): auth.test does not say it;
# without it, bots.info is asked, which needs users:read, a scope the
# manifest does not request, so an app made from it needs SLACK_APP_ID.
#
# Starts Postgres and NATS if they are not reachable, creates and migrates
# the `threadline` database, registers the installation the bot token
# belongs to (team, bot and granted scopes asked of Slack with auth.test;
# the app from SLACK_APP_ID, else bots.info), then runs the gateway on THREADLINE_GATEWAY_ADDR
# (default 127.0.0.1:3000) and the three workers until Ctrl-C. Expose the
# gateway over HTTPS and set the app's request URL to …/slack/events.
# Without Slack at hand, `make demo ARGS=--keep-running` runs everything
# against slack-sim instead.
#
# With TL_NATS_AUTH=1 (and TL_NATS_PORT of a free port, where services.sh
# starts a nats-server with threadline's users), every service logs in to NATS
# as its own user with its own password (.dev/nats-passwords-<port>.env), the
# broker refusing anything outside its subjects; the outbox relay then runs
# as its own process (user relay, THREADLINE_RELAY_ADDR, default
# 127.0.0.1:3004) and the gateway (user gateway) publishes nothing:
#
#   TL_NATS_AUTH=1 TL_NATS_PORT=14222 SLACK_SIGNING_SECRET=… SLACK_BOT_TOKEN=… make run
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
if [ -z "${SLACK_BOT_TOKEN:-}" ] || [ -z "${SLACK_SIGNING_SECRET:-}" ]; then
  cat >&2 <<'MSG'
make run connects threadline to a real Slack app. Set:
  SLACK_SIGNING_SECRET   the app's signing secret (Basic Information)
  SLACK_BOT_TOKEN        the bot token of a workspace install (xoxb-…)
  SLACK_APP_ID           the app's id (A…, Basic Information), unless the
                         token has users:read (then bots.info tells it)
Create the app from deploy/slack/manifest.yaml. To explore without Slack:
  make demo ARGS=--keep-running
MSG
  exit 2
fi
api="${SLACK_API_URL:-https://slack.com/api/}"
# The token goes to curl on its standard input (`-H @-`; printf is a shell
# builtin), never in an argument that `ps` would show.
slack() { printf 'Authorization: Bearer %s\n' "$SLACK_BOT_TOKEN" | curl -sS -D "$2" -H @- "${api%/}/$1"; }
headers="$(mktemp)"; trap 'rm -f "$headers"' EXIT
me="$(slack auth.test "$headers")"
field() { python3 -c 'import json,sys; v=json.loads(sys.argv[1]); print(v.get(sys.argv[2]) or "")' "$1" "$2"; }
[ "$(field "$me" ok)" = "True" ] || { echo "run: auth.test refused the token: $(field "$me" error)" >&2; exit 1; }
team="$(field "$me" team_id)"; bot_user="$(field "$me" user_id)"; bot_id="$(field "$me" bot_id)"
scopes="$(tr -d '\r' <"$headers" | awk -F': ' 'tolower($1)=="x-oauth-scopes"{print $2}')"
app="${SLACK_APP_ID:-}"
if [ -z "$app" ]; then
  # bots.info needs users:read, which threadline does not ask for.
  bot="$(slack "bots.info?bot=$bot_id" /dev/null)"
  app="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("bot",{}).get("app_id",""))' "$bot")"
  [ -n "$app" ] || { echo "run: set SLACK_APP_ID (the app's id, A…, on its Basic Information page); bots.info said: $(field "$bot" error)" >&2; exit 1; }
fi
echo "run: the token belongs to team $team, app $app, bot $bot_user ($bot_id); scopes: ${scopes:-unknown}"

"$root/scripts/services.sh" up
trap 'rm -f "$headers"; "$root/scripts/services.sh" down' EXIT
pg_port="${TL_PG_PORT:-5432}"
admin="postgres://postgres@127.0.0.1:$pg_port/postgres"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:$pg_port/threadline}"
export NATS_URL="${NATS_URL:-nats://127.0.0.1:${TL_NATS_PORT:-4222}}"
export THREADLINE_LOG_FORMAT="${THREADLINE_LOG_FORMAT:-text}"
mkdir -p .dev

cargo build -p threadline-cli -p threadline-gateway -p threadline-context-builder -p threadline-inference -p threadline-publisher
bin="${CARGO_TARGET_DIR:-$root/target}/debug"

# as ROLE COMMAND…: becomes COMMAND (exec: call it in a subshell or with &),
# logged in to NATS as ROLE's user when the broker has authorization
# (TL_NATS_AUTH=1). The password goes through the environment only.
nats_passwords=".dev/nats-passwords-${TL_NATS_PORT:-4222}.env"
as() {
  local role="$1"; shift
  if [ "${TL_NATS_AUTH:-0}" = 1 ]; then
    local var; var="NATS_PASSWORD_$(printf '%s' "$role" | tr 'a-z-' 'A-Z_')"
    NATS_PASSWORD="$(sed -n "s/^$var=//p" "$nats_passwords")"
    [ -n "$NATS_PASSWORD" ] || { echo "run: no $var in $nats_passwords" >&2; exit 1; }
    export NATS_USER="$role" NATS_PASSWORD
  fi
  exec "$@"
}
[ -s .dev/token-keys ] || "$bin/threadline" keys generate --id dev >.dev/token-keys
# (a symmetric key of an older checkout: an X25519 key goes first; made
# into a variable first, so that a failure stops here)
if ! grep -q ':x25519:' .dev/token-keys; then
  new_key="$("$bin/threadline" keys generate --id dev-x25519)"
  printf '%s,%s\n' "$new_key" "$(cat .dev/token-keys)" >.dev/token-keys.new
  unset new_key
  mv .dev/token-keys.new .dev/token-keys
fi
# The private keys open tokens: only the context-builder and the publisher
# are given them (never exported: inference and the gateway hold none).
token_keys="${THREADLINE_TOKEN_KEYS:-$(cat .dev/token-keys)}"
unset THREADLINE_TOKEN_KEYS
# The gateway (and `install add`) seal to the public halves.
if ! THREADLINE_TOKEN_PUBLIC_KEYS="$(THREADLINE_TOKEN_KEYS="$token_keys" "$bin/threadline" keys public)"; then
  echo "run: THREADLINE_TOKEN_KEYS lists no X25519 key: add one (threadline keys generate), or unset it to use .dev/token-keys" >&2
  exit 1
fi
# The audit pseudonyms' key, the same for every service.
[ -s .dev/audit-key ] || od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >.dev/audit-key
export THREADLINE_AUDIT_KEY="${THREADLINE_AUDIT_KEY:-$(cat .dev/audit-key)}"

db="$(basename "${DATABASE_URL%%\?*}")"
psql -q "$admin" -tc "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1 \
  || psql -q "$admin" -c "CREATE DATABASE \"$db\""
"$bin/threadline" migrate
# The bot token from SLACK_BOT_TOKEN in the environment (never an argument);
# then out of the environment: no service needs it in the clear.
THREADLINE_TOKEN_PUBLIC_KEYS="$THREADLINE_TOKEN_PUBLIC_KEYS" \
  "$bin/threadline" install add --team "$team" --app "$app" --bot-user "$bot_user" --bot-id "$bot_id" \
  ${scopes:+--scopes "$scopes"}
unset SLACK_BOT_TOKEN

relay=""
if [ "${TL_NATS_AUTH:-0}" = 1 ]; then
  # The relay declares the streams the workers wait for: first.
  (export THREADLINE_RELAY_ENABLED=true THREADLINE_GATEWAY_ADDR="${THREADLINE_RELAY_ADDR:-127.0.0.1:3004}"
   THREADLINE_TOKEN_PUBLIC_KEYS="$THREADLINE_TOKEN_PUBLIC_KEYS" as relay "$bin/threadline-gateway") &
  relay=$!
  export THREADLINE_RELAY_ENABLED=false
fi
THREADLINE_TOKEN_KEYS="$token_keys" as context-builder "$bin/threadline-context-builder" &
cb=$!
as inference "$bin/threadline-inference" &
inf=$!
THREADLINE_TOKEN_KEYS="$token_keys" as publisher "$bin/threadline-publisher" &
pub=$!
trap 'kill $relay "$cb" "$inf" "$pub" 2>/dev/null; wait $relay "$cb" "$inf" "$pub" 2>/dev/null; rm -f "$headers"; "$root/scripts/services.sh" down' EXIT
(export THREADLINE_TOKEN_PUBLIC_KEYS; as gateway "$bin/threadline-gateway")
