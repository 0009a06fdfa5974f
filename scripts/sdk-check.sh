#!/usr/bin/env bash
# slack-sim checked by Slack's own Python SDK: starts the built slack-sim
# binary on a free port and runs crates/slack-sim/sdk/check_slack_sdk.py
# against it (WebClient, the chat_stream helper, SignatureVerifier, the
# builtin SocketModeClient) and Bolt for Python (its request parsing of the
# agent messaging experience's events).
# slack_sdk and slack_bolt are installed once from PyPI into a virtualenv under
# ${XDG_CACHE_HOME:-$HOME/.cache}/threadline/sdk-venv; the pins below are the
# versions checked.
set -euo pipefail
cd "$(dirname "$0")/.."

SLACK_SDK="slack_sdk==3.48.0 slack_bolt==1.30.0"
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/threadline/sdk-venv"
TARGET="${CARGO_TARGET_DIR:-target}"
SIM="${SLACK_SIM_BIN:-$TARGET/debug/threadline-slack-sim}"

say() { printf 'sdk-check: %s\n' "$*"; }
die() { printf 'sdk-check: FAIL: %s\n' "$*" >&2; exit 1; }

[[ -x "$SIM" ]] || die "$SIM not found: build it first (cargo build -p threadline-slack-sim)"
stamp="$VENV/.threadline-requirements"
if [[ ! -x "$VENV/bin/python" || "$(cat "$stamp" 2>/dev/null)" != "$SLACK_SDK" ]]; then
  say "setting up $VENV ($SLACK_SDK)"
  rm -rf "$VENV"
  python3 -m venv "$VENV" || die "python3 -m venv failed (install python3-venv)"
  # shellcheck disable=SC2086
  "$VENV/bin/pip" install --quiet --disable-pip-version-check $SLACK_SDK \
    || die "pip install $SLACK_SDK failed (PyPI unreachable?)"
  echo "$SLACK_SDK" > "$stamp"
fi

port="$("$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
log="$(mktemp)"
"$SIM" --addr "127.0.0.1:$port" --seed 7 > "$log" 2>&1 &
sim=$!
trap 'kill "$sim" 2>/dev/null || true; wait "$sim" 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 100); do
  curl -fsS -o /dev/null -X POST -H 'content-type: application/json' -d '{}' "http://127.0.0.1:$port/_sim/settings" 2>/dev/null && break
  kill -0 "$sim" 2>/dev/null || { cat "$log" >&2; die "slack-sim exited"; }
  sleep 0.1
done
PYTHONDONTWRITEBYTECODE=1 "$VENV/bin/python" crates/slack-sim/sdk/check_slack_sdk.py "http://127.0.0.1:$port" \
  || { cat "$log" >&2; die "slack_sdk disagrees with slack-sim (see above)"; }
