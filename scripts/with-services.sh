#!/usr/bin/env bash
# Runs a command with PostgreSQL and NATS available, starting them first if
# they are not reachable and stopping afterwards only what was started here.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/services.sh" up
trap '"$here/services.sh" down' EXIT
"$@"
