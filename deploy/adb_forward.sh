#!/usr/bin/env bash
# Reach tandem servers on a USB-connected phone from this PC: `adb forward` each port (default
# 50051) to the same port on the phone, then check each with gRPC health.
#
#   deploy/adb_forward.sh [PORT ...]        e.g. deploy/adb_forward.sh 50051 8080
#
# Two layouts (see deploy/README.md):
#   worker on the phone (127.0.0.1:50051), gateway on the PC:
#     deploy/adb_forward.sh 50051
#     agent-gateway serve --worker http://127.0.0.1:50051      # gRPC :50052, HTTP :8080
#     controller -> localhost:50052 (gRPC) or http://localhost:8080/v1 (OpenAI)
#   worker and gateway on the phone (gateway on 127.0.0.1:50051):
#     deploy/adb_forward.sh 50051 8080
#     controller -> localhost:50051 (gRPC) or http://localhost:8080/v1 (OpenAI)
#
# Environment: ANDROID_SERIAL (which device, when several), ADB (adb binary), GATEWAY_BIN
# (agent-gateway binary for the health check; default: PATH, then target/release, target/debug),
# WAIT (seconds to wait for SERVING, default 10).
set -euo pipefail
cd "$(dirname "$0")/.."
ADB="${ADB:-adb}"
WAIT="${WAIT:-10}"
ports=("$@")
(( ${#ports[@]} )) || ports=(50051)

if ! command -v "$ADB" >/dev/null; then
  echo "error: adb not found; install Android platform-tools or set ADB" >&2
  exit 1
fi
gateway_bin="${GATEWAY_BIN:-}"
if [[ -z "$gateway_bin" ]]; then
  for c in "$(command -v agent-gateway || true)" "${CARGO_TARGET_DIR:-target}/release/agent-gateway" "${CARGO_TARGET_DIR:-target}/debug/agent-gateway"; do
    if [[ -n "$c" && -x "$c" ]]; then gateway_bin="$c"; break; fi
  done
fi

"$ADB" get-state >/dev/null || { echo "error: no device; check \`adb devices\`" >&2; exit 1; }
status=0
for p in "${ports[@]}"; do
  [[ "$p" =~ ^[0-9]+$ ]] || { echo "error: port must be a number, got $p" >&2; exit 2; }
  "$ADB" forward "tcp:$p" "tcp:$p"
  echo "forwarded localhost:$p -> phone 127.0.0.1:$p" >&2
  if [[ "$p" == 8080 ]]; then
    continue  # the HTTP endpoint; no gRPC health there
  fi
  if [[ -z "$gateway_bin" ]]; then
    echo "note: agent-gateway binary not found; skipping the health check of :$p" >&2
    continue
  fi
  if ! RUST_BACKTRACE=0 "$gateway_bin" health --addr "http://127.0.0.1:$p" --wait "$WAIT"; then
    echo "error: nothing SERVING on the phone's 127.0.0.1:$p; is device-worker (or agent-gateway) running there with --listen 127.0.0.1:$p?" >&2
    status=1
  fi
done
exit $status
