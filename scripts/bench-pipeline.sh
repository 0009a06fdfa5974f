#!/usr/bin/env bash
# The pipeline half of `make bench`: release binaries, slack-sim, the four
# services; mentions at a fixed rate; mention → reply latency from Slack's
# ground truth and each service's peak memory. Arguments go to
# threadline-bench-pipeline (--rate, --seconds, --channels).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
cargo build --release --workspace --bins
export THREADLINE_TEST_ADMIN_URL="${THREADLINE_TEST_ADMIN_URL:-postgres://postgres@127.0.0.1:${TL_PG_PORT:-5432}/postgres}"
export NATS_URL="${NATS_URL:-nats://127.0.0.1:${TL_NATS_PORT:-4222}}"
exec "${CARGO_TARGET_DIR:-$root/target}/release/threadline-bench-pipeline" "$@"
