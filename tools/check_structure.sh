#!/usr/bin/env bash
# The architecture's invariants as checks (ARCHITECTURE.md, "Invariants"); no build needed:
#   - the gateway links neither the engine nor the kernels,
#   - no module cycle inside device-worker,
#   - no function over 120 lines in device-worker (engine, speculative, state, model, ...),
#   - every path ARCHITECTURE.md names exists.
# Exits non-zero on the first failed check. Used by tools/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "structure: gateway dependencies"
if cargo tree -p agent-gateway -e normal --locked | grep -E 'device-worker|tandem-dsp'; then
  echo "error: agent-gateway links the engine or the kernels (above)" >&2
  exit 1
fi
echo "structure: module cycles in device-worker/src"
python3 tools/check_module_cycles.py device-worker/src | tail -n 1
echo "structure: function lengths"
python3 tools/check_fn_length.py device-worker/src | tail -n 1
echo "structure: paths named by ARCHITECTURE.md"
python3 tools/check_architecture_paths.py ARCHITECTURE.md
