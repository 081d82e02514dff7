#!/usr/bin/env bash
# Load and soak on loopback: starts a release device-worker and agent-gateway on free loopback
# ports, then runs `agent-gateway load` (N = 4, 8, 16 concurrent corpus episodes plus bursts
# of short OpenAI chat requests, each phase compared with a sequential baseline) and a soak
# (N = 4, episodes back to back for SOAK_S seconds, worker VmRSS at its start and end).
# Reports: $OUT/load.json, $OUT/soak.json, and the tables on stdout. Stops both servers on exit.
#
#   bench/load.sh                      # the issue-20 run: 4,8,16 then a 600 s soak
#   CONCURRENCY=4 SOAK_S=0 bench/load.sh   # quick: one phase, no soak
#
# Environment: TANDEM_MODEL (default: tools/fetch_model.sh), TANDEM_CORPUS, CONCURRENCY
# (4,8,16), STEPS (3), MAX_TOKENS (48), SOAK_S (600), SLOTS (16), THREADS (2), OUT (load-out),
# LOAD_ARGS (more `agent-gateway load` flags), WORKER_ARGS (more `device-worker serve` flags), PROFILE (release; `debug` runs the dev-profile
# binaries already built, without building).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${PROFILE:-release}
bin=${CARGO_TARGET_DIR:-target}/$profile
if [[ $profile == release ]]; then cargo build --release --locked -p device-worker -p agent-gateway; fi
model=${TANDEM_MODEL:-$(tools/fetch_model.sh)}
export TANDEM_CORPUS=${TANDEM_CORPUS:-$(cd .. && pwd)/shared/corpus/raw}
out=${OUT:-load-out}
mkdir -p "$out"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wport=$(port); gport=$(port); hport=$(port)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT
# shellcheck disable=SC2206
worker_flags=(--listen "127.0.0.1:$wport" --model "$model" --slots "${SLOTS:-16}" --threads "${THREADS:-2}" ${WORKER_ARGS:-})
gateway_flags=(--listen "127.0.0.1:$gport" --http-listen "127.0.0.1:$hport" --worker "http://127.0.0.1:$wport")
echo "load.sh: device-worker serve ${worker_flags[*]}"
echo "load.sh: agent-gateway serve ${gateway_flags[*]}"
"$bin/device-worker" serve "${worker_flags[@]}" 2>"$out/worker.log" & pids+=($!); wpid=$!
"$bin/agent-gateway" health --addr "http://127.0.0.1:$wport" --wait 120 >/dev/null
"$bin/agent-gateway" serve "${gateway_flags[@]}" 2>"$out/gateway.log" & pids+=($!); gpid=$!
"$bin/agent-gateway" health --addr "http://127.0.0.1:$gport" --wait 60 >/dev/null
common=(--gateway "http://127.0.0.1:$gport" --http "127.0.0.1:$hport" --worker-pid "$wpid" --gateway-pid "$gpid"
  --steps "${STEPS:-3}" --max-tokens "${MAX_TOKENS:-48}")
# shellcheck disable=SC2086
"$bin/agent-gateway" load "${common[@]}" --concurrency "${CONCURRENCY:-4,8,16}" --out "$out/load.json" ${LOAD_ARGS:-}
if (( ${SOAK_S:-600} > 0 )); then
  # shellcheck disable=SC2086
  "$bin/agent-gateway" load "${common[@]}" --concurrency 4 --rounds 0 --duration-s "${SOAK_S:-600}" \
    --out "$out/soak.json" ${LOAD_ARGS:-}
fi
