#!/usr/bin/env bash
# make image-smoke: build the images and run every service in a container
# against this machine's Postgres and NATS, one mention answered through
# slack-sim (tests/src/bin/image_smoke.rs says what is checked).
#
# A Docker engine is started when none answers (scripts/docker-engine.sh: it
# installs Debian's docker.io when missing and running as root) and stopped
# afterwards if started here. Where no engine can be had, or the images
# cannot be built here (no Debian packages for their base), one line says
# so and the script exits 0: the rest of `make test` has run and still
# counts. IMAGE_SMOKE=require (set by .ci/run) makes that a failure.
#
# Containers carry the label threadline-smoke=<run>; they are removed when
# the run ends, however it ends short of SIGKILL, and those of runs older
# than an hour (a run killed outright) at the next start.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

skip() {
  if [ "${IMAGE_SMOKE:-}" = require ]; then
    echo "image-smoke: FAIL (IMAGE_SMOKE=require): $*" >&2
    exit 1
  fi
  echo "image-smoke: skipped: $*"
  exit 0
}

why="$(mktemp)"
status=0
"$root/scripts/docker-engine.sh" up 2>"$why" || status=$?
reason="$(grep -v '^docker-engine: \(starting\|installing\)' "$why" | tail -n 1 | sed 's/^docker-engine: //' || true)"
grep '^docker-engine: \(starting\|installing\)' "$why" >&2 || true
rm -f "$why"
if [ "$status" = 3 ]; then
  skip "${reason:-no Docker engine}"
elif [ "$status" != 0 ]; then
  echo "image-smoke: FAIL: scripts/docker-engine.sh up: $reason" >&2
  exit "$status"
fi

run="$(date +%s)-$$"
export THREADLINE_SMOKE_RUN="$run"
remove() { # containers with label $1
  local ids
  ids="$(docker ps -aq --filter "label=$1" 2>/dev/null || true)"
  [ -z "$ids" ] || docker rm -f -v $ids >/dev/null 2>&1 || true
}
finish() {
  remove "threadline-smoke=$run"
  "$root/scripts/docker-engine.sh" down
}
trap finish EXIT
trap 'exit 130' INT TERM
# Leftovers of runs killed outright, an hour or more ago.
for id in $(docker ps -aq --filter label=threadline-smoke 2>/dev/null || true); do
  created="$(docker inspect -f '{{.Created}}' "$id" 2>/dev/null || true)"
  if [ -n "$created" ] && [ $(( $(date +%s) - $(date -d "$created" +%s) )) -gt 3600 ]; then
    docker rm -f -v "$id" >/dev/null 2>&1 || true
  fi
done

status=0
"$root/scripts/images.sh" || status=$?
if [ "$status" = 3 ]; then
  skip "the images cannot be built on this machine (see the line above)"
elif [ "$status" != 0 ]; then
  exit "$status"
fi
cargo build -q -p threadline-tests --bin threadline-image-smoke
"${CARGO_TARGET_DIR:-$root/target}/debug/threadline-image-smoke"
