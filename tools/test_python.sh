#!/usr/bin/env bash
# Python client tests (clients/python): creates or reuses a venv at $TANDEM_CACHE/py-venv with
# pinned packages, generates the gRPC stubs and runs pytest. The tests start the debug
# device-worker and agent-gateway binaries ($CARGO_TARGET_DIR/debug or target/debug), so build
# them first (tools/test.sh does). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${TANDEM_CACHE:-$HOME/.cache/tandem}"
VENV="$CACHE/py-venv"
PY="${PYTHON:-python3}"
# Pinned: bump together (grpcio-tools pins its protobuf range).
PACKAGES=(openai==2.54.0 grpcio==1.85.1 grpcio-tools==1.85.1 grpcio-reflection==1.85.1 protobuf==7.36.2 pytest==9.0.2)

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "== creating $VENV" >&2
  if ! "$PY" -m venv "$VENV"; then
    # Debian/Ubuntu ship venv separately.
    if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
      rm -rf "$VENV"
      apt-get update && apt-get install -y python3-venv
      "$PY" -m venv "$VENV"
    else
      echo "error: '$PY -m venv' failed; install the venv module (e.g. apt-get install python3-venv)" >&2
      exit 1
    fi
  fi
fi
stamp="$VENV/.tandem-packages"
if [[ "$(cat "$stamp" 2>/dev/null)" != "${PACKAGES[*]}" ]]; then
  echo "== installing ${PACKAGES[*]}" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PACKAGES[@]}"
  echo "${PACKAGES[*]}" >"$stamp"
fi
PYTHON="$VENV/bin/python" clients/python/gen_stubs.sh
cd clients/python
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" -m pytest -q "$@"
