#!/usr/bin/env bash
# A Docker engine for `make images` and the container smoke test, started
# only where none answers, and stopped afterwards only if started here.
#
#   scripts/docker-engine.sh up     exit 0: an engine answers (started if need be)
#                                   exit 3: none can be had here (one line says why)
#   scripts/docker-engine.sh down   stop the dockerd that `up` started
#
# `up` uses Debian's dockerd (package docker.io, installed with apt-get when
# running as root and missing) with its defaults (overlay2, cgroupfs), logging
# to .dev/dockerd.log. Images stay in the engine's store between runs, so the
# runtime base is made once.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dev="$root/.dev"
pidfile="$dev/dockerd.pid"
say() { echo "docker-engine: $*" >&2; }

answers() { docker info >/dev/null 2>&1; }

up() {
  if answers; then return 0; fi
  local sock=/var/run/docker.sock
  if [ -S "$sock" ] && [ ! -w "$sock" ]; then
    say "no Docker engine: $sock is there but this user may not use it (add it to the docker group)"
    exit 3
  fi
  if ! command -v dockerd >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      say "installing Debian's docker.io (dockerd, containerd, runc)"
      export DEBIAN_FRONTEND=noninteractive
      { apt-get install -y -q docker.io || { apt-get update -q && apt-get install -y -q docker.io; }; } \
        >"$dev/docker-install.log" 2>&1 \
        || { say "no Docker engine: apt-get install docker.io failed (see $dev/docker-install.log)"; exit 3; }
      # Where a service manager runs, the package may have started it.
      for _ in $(seq 1 25); do answers && return 0; sleep 0.2; done
    else
      say "no Docker engine answers and dockerd is not installed (install Docker, or run as root with apt-get)"
      exit 3
    fi
  fi
  if [ "$(id -u)" != 0 ]; then
    say "no Docker engine answers, and dockerd must be started as root (sudo dockerd, or your system's service)"
    exit 3
  fi
  say "starting dockerd (log: $dev/dockerd.log)"
  dockerd >"$dev/dockerd.log" 2>&1 &
  echo $! >"$pidfile"
  for _ in $(seq 1 150); do
    if answers; then return 0; fi
    if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      rm -f "$pidfile"
      say "no Docker engine: dockerd exited at start ($(tail -n 1 "$dev/dockerd.log"))"
      exit 3
    fi
    sleep 0.2
  done
  say "no Docker engine: dockerd did not answer within 30 s (see $dev/dockerd.log)"
  down
  exit 3
}

down() {
  [ -f "$pidfile" ] || return 0
  local pid; pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null; then
    say "stopping the dockerd started here"
    kill "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      say "dockerd did not stop within 20 s: killing it"
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$pidfile"
}

mkdir -p "$dev"
case "${1:-}" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
