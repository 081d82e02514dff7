#!/usr/bin/env bash
# The main job, end to end on this machine: fetch the default model, build, start a
# device-worker and an agent-gateway on loopback, replay a real corpus episode through them
# over gRPC, print the per-step table, and stop both servers.
#
#   deploy/demo.sh [replay options...]     e.g. deploy/demo.sh --count 3 --max-steps 4
#
# Environment: TANDEM_CACHE (model cache, default ~/.cache/tandem), TANDEM_MODEL (another
# GGUF), WORKER_PORT (50051), GATEWAY_PORT (50052), THREADS (all cores), CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null; then
  echo "error: cargo (Rust toolchain) not found; install it with rustup (https://rustup.rs)" >&2
  exit 1
fi

MODEL="${TANDEM_MODEL:-$(tools/fetch_model.sh)}"
WORKER_PORT="${WORKER_PORT:-50051}"
GATEWAY_PORT="${GATEWAY_PORT:-50052}"
OUT=replay-out
mkdir -p "$OUT"

echo "== building (release) ..." >&2
cargo build --release --locked -p device-worker -p agent-gateway >&2
BIN="${CARGO_TARGET_DIR:-target}/release"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

echo "== starting device-worker on 127.0.0.1:$WORKER_PORT (log: $OUT/worker.log)" >&2
"$BIN/device-worker" serve --listen "127.0.0.1:$WORKER_PORT" --model "$MODEL" ${THREADS:+--threads "$THREADS"} \
  >"$OUT/worker.log" 2>&1 &
pids+=($!)
echo "== starting agent-gateway on 127.0.0.1:$GATEWAY_PORT (log: $OUT/gateway.log)" >&2
"$BIN/agent-gateway" serve --listen "127.0.0.1:$GATEWAY_PORT" --worker "http://127.0.0.1:$WORKER_PORT" \
  >"$OUT/gateway.log" 2>&1 &
pids+=($!)

"$BIN/agent-gateway" health --addr "http://127.0.0.1:$WORKER_PORT" --service tandem.step.v1.StepService --wait 120 >&2 \
  || { echo "worker did not become ready; see $OUT/worker.log" >&2; tail -20 "$OUT/worker.log" >&2; exit 1; }
"$BIN/agent-gateway" health --addr "http://127.0.0.1:$GATEWAY_PORT" --wait 30 >&2 \
  || { echo "gateway did not become ready; see $OUT/gateway.log" >&2; exit 1; }

echo "== replaying" >&2
"$BIN/agent-gateway" replay --gateway "http://127.0.0.1:$GATEWAY_PORT" --out "$OUT/replay.jsonl" "$@"
