#!/usr/bin/env bash
# Starts the PostgreSQL and NATS (JetStream) servers threadline needs, but only
# where none is reachable already, from the system's initdb/pg_ctl/postgres and
# nats-server binaries, with data under .dev/ (git-ignored) on loopback.
# Stops only what it started.
#
#   scripts/services.sh up       start what is missing
#   scripts/services.sh down     stop what `up` started
#   scripts/services.sh status   say what is reachable
#
# Ports: TL_PG_PORT (default 5432), TL_NATS_PORT (default 4222). TL_PG_OPTS:
# more server settings for a Postgres started here, e.g.
# "-c shared_preload_libraries=pg_stat_statements" for the pipeline bench's
# statement counts.
#
# TL_NATS_AUTH=1: the nats-server this script starts admits only threadline's
# users, each limited to its subjects (`threadline nats auth`, for
# THREADLINE_BUS_PREFIX, default tl), with passwords made once into
# .dev/nats-passwords-<port>.env (mode 600; `make run` gives each service its
# own). Off by default: the tests and the demo connect without a user, each
# test on a bus prefix of its own, which per-prefix users cannot cover. A
# server already listening on the port is used only if it, too, requires a
# login.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dev="$root/.dev"
pg_port="${TL_PG_PORT:-5432}"
nats_port="${TL_NATS_PORT:-4222}"
started="$dev/started-$pg_port-$nats_port"

say() { echo "services: $*" >&2; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pg_ready() {
  if command -v pg_isready >/dev/null; then
    pg_isready -q -h 127.0.0.1 -p "$pg_port"
  else
    port_open "$pg_port"
  fi
}

find_pg_bin() {
  local name="$1"
  if command -v "$name" >/dev/null; then command -v "$name"; return; fi
  local c
  for c in /usr/lib/postgresql/*/bin/"$name"; do
    [ -x "$c" ] && { echo "$c"; return; }
  done
  say "$name not found: install PostgreSQL (e.g. apt-get install postgresql)"; exit 1
}

# PostgreSQL refuses to run as root: run it as the 'postgres' user then.
as_pg_user() {
  if [ "$(id -u)" = 0 ]; then runuser -u "${TL_PG_OS_USER:-postgres}" -- "$@"; else "$@"; fi
}

# A server that is up but refuses the project's password-less `postgres`
# user (a distribution's own cluster with peer/password auth, say) would
# fail every test with an authentication error: say what to do instead.
pg_auth_ok() {
  command -v psql >/dev/null || return 0
  local url="${THREADLINE_TEST_ADMIN_URL:-postgres://postgres@127.0.0.1:$pg_port/postgres}" out
  if out="$(PGCONNECT_TIMEOUT=5 psql "$url" -Atqc 'select 1' 2>&1)"; then return 0; fi
  local shown; shown="$(printf '%s' "${url%%\?*}" | sed -E 's#//([^:/@]+):[^@]*@#//\1:[redacted]@#')"
  say "postgres on 127.0.0.1:$pg_port is up but refuses $shown: $out"
  say "either allow it (trust or a password in THREADLINE_TEST_ADMIN_URL and DATABASE_URL),"
  say "or let this script start its own: TL_PG_PORT=25432 (any free port below 32768)"
  return 1
}

pg_up() {
  if pg_ready; then
    pg_auth_ok || exit 1
    say "postgres reachable on 127.0.0.1:$pg_port (using it)"
    return
  fi
  local initdb pg_ctl data="$dev/pg-$pg_port"
  initdb="$(find_pg_bin initdb)"; pg_ctl="$(find_pg_bin pg_ctl)"
  mkdir -p "$dev"
  if [ "$(id -u)" = 0 ]; then
    # The data directory (and its parents) must be usable by the server's user.
    chmod o+x "$dev"
    mkdir -p "$data" && chown "${TL_PG_OS_USER:-postgres}" "$data"
  fi
  if [ ! -s "$data/PG_VERSION" ]; then
    say "initialising a local cluster in $data"
    as_pg_user "$initdb" -D "$data" -U postgres --auth=trust -E UTF8 >"$dev/initdb-$pg_port.log" 2>&1 \
      || { cat "$dev/initdb-$pg_port.log" >&2; exit 1; }
  fi
  say "starting postgres on 127.0.0.1:$pg_port"
  as_pg_user "$pg_ctl" -D "$data" -l "$data/server.log" -w -t 30 \
    -o "-c listen_addresses=127.0.0.1 -p $pg_port -k $data ${TL_PG_OPTS:-}" start >/dev/null \
    || { tail -20 "$data/server.log" >&2; exit 1; }
  echo "pg $data" >>"$started"
}

# Whether the server on the NATS port requires a login (its INFO line says).
nats_auth_required() {
  local info
  info="$(timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$nats_port && head -1 <&3" 2>/dev/null)" || return 1
  [[ "$info" == *'"auth_required":true'* ]]
}

# The threadline CLI, built if needed (it renders the users and passwords).
threadline_cli() {
  (cd "$root" && cargo build -q -p threadline-cli) >&2 || { say "building the threadline CLI failed"; exit 1; }
  echo "${CARGO_TARGET_DIR:-$root/target}/debug/threadline"
}

nats_up() {
  local auth="${TL_NATS_AUTH:-0}"
  if port_open "$nats_port"; then
    if [ "$auth" = 1 ] && ! nats_auth_required; then
      say "nats on 127.0.0.1:$nats_port admits anyone; TL_NATS_AUTH=1 needs a server with threadline's users:"
      say "choose a free port, e.g. TL_NATS_PORT=14222, and this script starts one"
      exit 1
    fi
    say "nats reachable on 127.0.0.1:$nats_port (using it)"; return
  fi
  command -v nats-server >/dev/null || { say "nats-server not found: install it (e.g. apt-get install nats-server)"; exit 1; }
  local data="$dev/nats-$nats_port" passwords="" conf=()
  mkdir -p "$data"
  if [ "$auth" = 1 ]; then
    local cli; cli="$(threadline_cli)"
    passwords="$dev/nats-passwords-$nats_port.env"
    [ -s "$passwords" ] || (umask 077 && "$cli" nats passwords >"$passwords")
    "$cli" nats auth --prefix "${THREADLINE_BUS_PREFIX:-tl}" >"$data/authorization.conf"
    conf=(-c "$data/authorization.conf")
    say "starting nats-server -js on 127.0.0.1:$nats_port with threadline's users (passwords in $passwords)"
  else
    say "starting nats-server -js on 127.0.0.1:$nats_port"
  fi
  # The passwords reach nats-server through its environment only.
  (
    if [ -n "$passwords" ]; then set -a; . "$passwords"; set +a; fi
    exec nohup nats-server -a 127.0.0.1 -p "$nats_port" -js -sd "$data" -P "$data/nats.pid" -l "$data/server.log" \
      "${conf[@]}"
  ) >/dev/null 2>&1 &
  for _ in $(seq 1 100); do port_open "$nats_port" && break; sleep 0.1; done
  port_open "$nats_port" || { tail -20 "$data/server.log" >&2; exit 1; }
  echo "nats $data" >>"$started"
}

down() {
  [ -f "$started" ] || { say "nothing was started by this script"; return; }
  local kind data
  while read -r kind data; do
    case "$kind" in
      pg) say "stopping postgres ($data)"; as_pg_user "$(find_pg_bin pg_ctl)" -D "$data" -m fast -w stop >/dev/null || true ;;
      nats) say "stopping nats-server ($data)"; [ -f "$data/nats.pid" ] && kill "$(cat "$data/nats.pid")" 2>/dev/null || true ;;
    esac
  done <"$started"
  rm -f "$started"
}

case "${1:-}" in
  up) pg_up; nats_up ;;
  down) down ;;
  status)
    if pg_ready; then say "postgres: up on $pg_port"; else say "postgres: down on $pg_port"; fi
    if ! port_open "$nats_port"; then say "nats: down on $nats_port"
    elif nats_auth_required; then say "nats: up on $nats_port (login required)"
    else say "nats: up on $nats_port"; fi ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
