#!/usr/bin/env bash
# Regenerate greedy parity fixtures from the llama.cpp peer with the default paths:
#   prompts: device-worker/tests/fixtures/parity/prompts/*.txt
#   output:  device-worker/tests/fixtures/parity/<name>.json
# Builds llama.cpp first if needed (~15 min on 2 cores, once). Never run in CI.
# Extra arguments are passed to parity_fixtures.py (e.g. --n-predict 64 --ignore-eos).
# Env: TANDEM_CACHE (default $HOME/.cache/tandem), TANDEM_MODEL (GGUF to use).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${TANDEM_CACHE:-$HOME/.cache/tandem}"
MODEL="${TANDEM_MODEL:-$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf}"

"$ROOT/tools/peer/build_llama_cpp.sh"
exec python3 "$ROOT/tools/peer/parity_fixtures.py" \
  --model "$MODEL" \
  --prompts "$ROOT/device-worker/tests/fixtures/parity/prompts" \
  --out "$ROOT/device-worker/tests/fixtures/parity" \
  --n-predict 48 \
  "$@"
