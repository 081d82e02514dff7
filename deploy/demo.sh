#!/usr/bin/env bash
# The main job, end to end on this machine: fetch the default model, build, start a
# device-worker and an agent-gateway on loopback, replay a real corpus episode through them
# over gRPC, print the per-step table, and stop both servers.
#
#   deploy/demo.sh [replay options...]     e.g. deploy/demo.sh --count 3 --max-steps 4
#
# Screenshots (issue 19): `--screenshots never|auto|always` goes to the gateway's `serve` and to
# the replay (which then sends the corpus screenshots); the worker gets the projector from
# TANDEM_MMPROJ. The tiny VL fixture end to end on trace_18:
#   TANDEM_MODEL=device-worker/tests/fixtures/qwen35vl/tiny-qwen35vl-f32.gguf \
#   TANDEM_MMPROJ=device-worker/tests/fixtures/qwen35vl/mmproj-tiny-qwen35vl-f32.gguf \
#   deploy/demo.sh --screenshots always --episode llamatouch/trace_18
#
# Environment: TANDEM_CACHE (model cache, default ~/.cache/tandem), TANDEM_MODEL (another
# GGUF), TANDEM_MMPROJ (its vision projector GGUF: the worker's --mmproj), IMAGE_MAX_TOKENS
# (the worker's --image-max-tokens with TANDEM_MMPROJ; default 1024 here: llama.cpp's 4096 gives
# a 1080x2400 screenshot 2550 tokens, which with the ~2000-token text prompt overflows the
# worker's default 4096-token context), WORKER_PORT (50051), GATEWAY_PORT
# (50052), HTTP_LISTEN (the gateway's OpenAI endpoint, e.g. 127.0.0.1:8080; default off),
# THREADS (all cores), CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null; then
  echo "error: cargo (Rust toolchain) not found; install it with rustup (https://rustup.rs)" >&2
  exit 1
fi

MODEL="${TANDEM_MODEL:-$(tools/fetch_model.sh)}"
MMPROJ="${TANDEM_MMPROJ:-}"
IMAGE_MAX_TOKENS="${IMAGE_MAX_TOKENS:-1024}"
if [[ -n "$MMPROJ" && ! -f "$MMPROJ" ]]; then
  echo "error: TANDEM_MMPROJ=$MMPROJ is not a file (the vision projector GGUF for --mmproj)" >&2
  exit 1
fi
# The replay's --screenshots also sets the gateway's (same value).
SCREENSHOTS=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --screenshots) SCREENSHOTS="${args[i + 1]:-}" ;;
    --screenshots=*) SCREENSHOTS="${args[i]#--screenshots=}" ;;
  esac
done
if [[ "$SCREENSHOTS" == always && -z "$MMPROJ" ]]; then
  echo "error: --screenshots always needs a vision model: set TANDEM_MMPROJ to its projector GGUF (and TANDEM_MODEL to the text GGUF)" >&2
  exit 1
fi
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

# Refuse ports another process already listens on: its answers would pass for our servers'
# (an earlier demo still running would serve this run with its own model).
for port in "$WORKER_PORT" "$GATEWAY_PORT"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "error: 127.0.0.1:$port is in use by another process (an earlier demo still running?); stop it, or set WORKER_PORT / GATEWAY_PORT to free ports" >&2
    exit 1
  fi
done

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

echo "== starting device-worker on 127.0.0.1:$WORKER_PORT (log: $OUT/worker.log)" >&2
"$BIN/device-worker" serve --listen "127.0.0.1:$WORKER_PORT" --model "$MODEL" ${THREADS:+--threads "$THREADS"} \
  ${MMPROJ:+--mmproj "$MMPROJ"} ${MMPROJ:+${IMAGE_MAX_TOKENS:+--image-max-tokens "$IMAGE_MAX_TOKENS"}} \
  --auth-token-file "$TOKENS" \
  >"$OUT/worker.log" 2>&1 &
pids+=($!)
echo "== starting agent-gateway on 127.0.0.1:$GATEWAY_PORT (log: $OUT/gateway.log)" >&2
"$BIN/agent-gateway" serve --listen "127.0.0.1:$GATEWAY_PORT" --worker "http://127.0.0.1:$WORKER_PORT" \
  --auth-token-file "$TOKENS" --worker-token-file "$TOKENS" \
  --http-listen "${HTTP_LISTEN:-off}" ${SCREENSHOTS:+--screenshots "$SCREENSHOTS"} >"$OUT/gateway.log" 2>&1 &
pids+=($!)

# Wait until a server we started reports SERVING; fail at once if it exited (bad model, port
# in use: its log says why), so we never talk to some other process on that port.
wait_ready() { # name pid addr service log seconds
  local name=$1 pid=$2 addr=$3 service=$4 log=$5 deadline=$((SECONDS + $6))
  while true; do
    # Alive first: a server that could not listen must not pass for ready.
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "error: $name exited; last lines of $log:" >&2; tail -5 "$log" >&2; exit 1
    fi
    "$BIN/agent-gateway" health --addr "$addr" --service "$service" >/dev/null 2>&1 && break
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
