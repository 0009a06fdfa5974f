#!/usr/bin/env bash
# A real model in the loop: the end-to-end tests of tests/tests/real_model.rs
# against the binaries, with llama.cpp's OpenAI-compatible server serving
# SmolLM2-135M-Instruct from the virtualenv scripts/model-venv.sh prepares
# once (the tests start the server themselves, scripts/model_server.py).
# Needs Postgres and NATS as the other tests do (make test starts them) and
# the workspace binaries built. REAL_MODEL=skip skips it with a notice (a
# machine without PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${REAL_MODEL:-}" == skip ]]; then
  printf 'real-model-check: skipped (REAL_MODEL=skip): the end-to-end tests with a real model did not run\n'
  exit 0
fi
THREADLINE_REAL_MODEL_PYTHON="$(./scripts/model-venv.sh)"
export THREADLINE_REAL_MODEL_PYTHON
if cargo nextest --version >/dev/null 2>&1; then
  # One at a time: each starts a model server and a whole stack.
  cargo nextest run -p threadline-tests --test real_model --run-ignored only --test-threads 1
else
  cargo test -p threadline-tests --test real_model -- --ignored --test-threads 1
fi
