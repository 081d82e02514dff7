#!/usr/bin/env bash
# The main job, end to end on this machine: fetch the default model, build, start a
# device-worker and an agent-gateway on loopback, replay a real corpus episode through them
# over gRPC, print the per-step table, and stop both servers.
#
#   deploy/demo.sh [replay options...]     e.g. deploy/demo.sh --count 3 --max-steps 4
#
# Environment: TANDEM_CACHE (model cache, default ~/.cache/tandem), TANDEM_MODEL (another
# GGUF), WORKER_PORT (50051), GATEWAY_PORT (50052), HTTP_LISTEN (the gateway's OpenAI endpoint,
# e.g. 127.0.0.1:8080; default off), THREADS (all cores), CARGO_TARGET_DIR.
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

# One bearer token for both servers (a new one per run, readable by this user only): the
# worker and the gateway require it, the gateway sends it to the worker, the replay to the
# gateway. On a phone, any app could otherwise drive the agent over loopback.
TOKENS="$OUT/tokens"
(umask 077 && python3 -c 'import secrets; print(secrets.token_hex(32))' >"$TOKENS")

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

echo "== starting device-worker on 127.0.0.1:$WORKER_PORT (log: $OUT/worker.log)" >&2
"$BIN/device-worker" serve --listen "127.0.0.1:$WORKER_PORT" --model "$MODEL" ${THREADS:+--threads "$THREADS"} \
  --auth-token-file "$TOKENS" \
  >"$OUT/worker.log" 2>&1 &
pids+=($!)
echo "== starting agent-gateway on 127.0.0.1:$GATEWAY_PORT (log: $OUT/gateway.log)" >&2
"$BIN/agent-gateway" serve --listen "127.0.0.1:$GATEWAY_PORT" --worker "http://127.0.0.1:$WORKER_PORT" \
  --auth-token-file "$TOKENS" --worker-token-file "$TOKENS" \
  --http-listen "${HTTP_LISTEN:-off}" >"$OUT/gateway.log" 2>&1 &
pids+=($!)

# Wait until a server we started reports SERVING; fail at once if it exited (bad model, port
# in use: its log says why), so we never talk to some other process on that port.
wait_ready() { # name pid addr service log seconds
  local name=$1 pid=$2 addr=$3 service=$4 log=$5 deadline=$((SECONDS + $6))
  until "$BIN/agent-gateway" health --addr "$addr" --service "$service" >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "error: $name exited; last lines of $log:" >&2; tail -5 "$log" >&2; exit 1
    fi
    if (( SECONDS >= deadline )); then
      echo "error: $name not ready after $6 s; see $log" >&2; exit 1
    fi
    sleep 0.3
  done
  echo "$name ready on $addr" >&2
}
wait_ready device-worker "${pids[0]}" "http://127.0.0.1:$WORKER_PORT" tandem.step.v1.StepService "$OUT/worker.log" 120
wait_ready agent-gateway "${pids[1]}" "http://127.0.0.1:$GATEWAY_PORT" "" "$OUT/gateway.log" 30

echo "== replaying" >&2
"$BIN/agent-gateway" replay --gateway "http://127.0.0.1:$GATEWAY_PORT" --token-file "$TOKENS" \
  --out "$OUT/replay.jsonl" "$@"
