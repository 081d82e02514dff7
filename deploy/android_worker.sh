#!/usr/bin/env bash
# Run device-worker on a USB-connected Android phone: push the binary and the model with adb,
# start the worker there (in the background, surviving the adb session), forward its port to
# this PC and wait until it is SERVING (deploy/adb_forward.sh).
#
#   deploy/android_worker.sh start [MODEL.gguf]   push (if changed), start, forward, health check
#   deploy/android_worker.sh stop                 stop the worker started by this script
#   deploy/android_worker.sh log                  print the worker's log on the phone
#
# Environment: ANDROID_SERIAL (which device), ADB (adb binary), WORKER_BIN (the aarch64 binary;
# default: the static build of tools/aarch64/build.sh,
# target/aarch64-unknown-linux-gnu/release/device-worker, else an Android NDK build in
# target/aarch64-linux-android/release/device-worker), PORT (gRPC, default
# 50051), METRICS_PORT (worker /metrics on the phone, forwarded too; default off, needs a
# worker built with --metrics-listen), THREADS, DIR (folder on the phone, default
# /data/local/tmp/tandem), WAIT (seconds for the model to load, default 180).
set -euo pipefail
cd "$(dirname "$0")/.."
ADB="${ADB:-adb}"
PORT="${PORT:-50051}"
DIR="${DIR:-/data/local/tmp/tandem}"
static_bin="${CARGO_TARGET_DIR:-target}/aarch64-unknown-linux-gnu/release/device-worker"
ndk_bin="${CARGO_TARGET_DIR:-target}/aarch64-linux-android/release/device-worker"
if [[ -z "${WORKER_BIN:-}" ]]; then
  WORKER_BIN="$static_bin"
  [[ ! -x "$static_bin" && -x "$ndk_bin" ]] && WORKER_BIN="$ndk_bin"
fi
WAIT="${WAIT:-180}"
cmd="${1:-start}"

command -v "$ADB" >/dev/null || { echo "error: adb not found; install Android platform-tools or set ADB" >&2; exit 1; }
"$ADB" get-state >/dev/null || { echo "error: no device; check \`adb devices\`" >&2; exit 1; }
[[ "$PORT" =~ ^[0-9]+$ ]] || { echo "error: PORT must be a number, got $PORT" >&2; exit 2; }

case "$cmd" in
  stop)
    "$ADB" shell "if [ -f $DIR/worker.pid ]; then kill \$(cat $DIR/worker.pid) 2>/dev/null; rm -f $DIR/worker.pid; echo stopped; else echo 'not running'; fi"
    exit 0 ;;
  log)
    exec "$ADB" shell "cat $DIR/worker.log" ;;
  start) ;;
  *) echo "usage: $0 start [MODEL.gguf] | stop | log" >&2; exit 2 ;;
esac

MODEL="${2:-${TANDEM_MODEL:-$(tools/fetch_model.sh)}}"
[[ -x "$WORKER_BIN" ]] || { echo "error: $WORKER_BIN not found; build the static aarch64 worker with tools/aarch64/build.sh (or an NDK build: cargo build --release --target aarch64-linux-android -p device-worker), or set WORKER_BIN" >&2; exit 1; }
if command -v file >/dev/null && ! file -b "$WORKER_BIN" | grep -q "ARM aarch64"; then
  echo "error: $WORKER_BIN is not an aarch64 executable ($(file -b "$WORKER_BIN"))" >&2; exit 1
fi
[[ -f "$MODEL" ]] || { echo "error: model $MODEL not found" >&2; exit 1; }

# Push only what changed (same size on the phone: skip; models are hundreds of MB).
push() { # local remote
  local size remote_size
  size=$(stat -c %s "$1")
  remote_size=$("$ADB" shell "stat -c %s '$2' 2>/dev/null || echo 0" | tr -d '\r')
  if [[ "$size" == "$remote_size" ]]; then echo "up to date: $2" >&2; else "$ADB" push "$1" "$2" >&2; fi
}
"$ADB" shell "mkdir -p $DIR"
push "$WORKER_BIN" "$DIR/device-worker"
"$ADB" shell "chmod 755 $DIR/device-worker"
model_name=$(basename "$MODEL")
push "$MODEL" "$DIR/$model_name"

args="serve --listen 127.0.0.1:$PORT --model $DIR/$model_name"
[[ -n "${THREADS:-}" ]] && args="$args --threads $THREADS"
[[ -n "${METRICS_PORT:-}" ]] && args="$args --metrics-listen 127.0.0.1:$METRICS_PORT"
# Stop an earlier instance, then start detached (nohup + setsid-like: the shell exits at once).
"$ADB" shell "if [ -f $DIR/worker.pid ]; then kill \$(cat $DIR/worker.pid) 2>/dev/null; fi; cd $DIR && nohup ./device-worker $args >worker.log 2>&1 & echo \$! > $DIR/worker.pid"
echo "started on the phone: device-worker $args (log: $0 log)" >&2

ports=("$PORT")
[[ -n "${METRICS_PORT:-}" ]] && "$ADB" forward "tcp:$METRICS_PORT" "tcp:$METRICS_PORT" && echo "forwarded metrics localhost:$METRICS_PORT" >&2
WAIT="$WAIT" deploy/adb_forward.sh "${ports[@]}"
