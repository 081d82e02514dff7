#!/usr/bin/env bash
# Idle power of the device-worker vs llama.cpp's llama-server (a measurement, not a test).
#
# Usage: bench/idle_power.sh [--ours PATH] [--peer PATH] [--model GGUF] [--threads 2]
# In one run (about 5 minutes):
#  A. our release-built worker (--idle-release-ms 3000, linux power backend) and llama-server
#     (same model, same threads) each get one request; then the CPU time (utime+stime from
#     /proc/PID/stat, 10 ms ticks; and the threads' schedstat run time, ns) each uses over
#     60 s idle.
#  B/C. residency of the deepest cpuidle state (/sys/devices/system/cpu/cpu*/cpuidle) over 20 s
#     with our worker released (llama-server stopped) vs a second worker holding its votes
#     (--idle-release-ms 1000000000); "unavailable" without that sysfs tree.
#  D. wake-up latency of the first request after 5 s and 30 s pauses (votes released) vs
#     requests with votes held: the worker's own wake_ms (FinalStats) and the client's time
#     to the first token.
# Prints a markdown table on stdout (progress on stderr). Needs a quiet machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${TANDEM_CACHE:-$HOME/.cache/tandem}"
MODEL="${TANDEM_MODEL:-$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
OURS="$ROOT/target/release/device-worker"
PEER="$CACHE/peer/llama-cpp-python-0.3.36/vendor/llama.cpp/build/bin/llama-server"
THREADS=2
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
parse_options idle_power 16 --ours:OURS --peer:PEER --model:MODEL --threads:THREADS -- "$@"
for f in "$OURS" "$PEER" "$MODEL"; do
  [[ -e "$f" ]] || { echo "idle_power: $f not found (cargo build --release -p device-worker?)" >&2; exit 1; }
done

PORT_A=50161; PORT_H=50162; PORT_PEER=8191
PROMPT="<|im_start|>user
Open the settings app.<|im_end|>
<|im_start|>assistant
"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "${SNAP:-/nonexistent}"; }
trap cleanup EXIT
log() { echo "[idle_power] $*" >&2; }
HZ=$(getconf CLK_TCK)
cpu_ms() { # utime+stime of PID in ms
  awk -v hz="$HZ" '{ s=$0; sub(/^.*\) /, "", s); split(s, f, " "); print (f[12]+f[13])*1000/hz }' "/proc/$1/stat"
}
sched_snap() { # "TID run_ns" for every live thread of PID (/proc/PID/task/*/schedstat)
  for t in /proc/"$1"/task/*; do echo "${t##*/} $(cut -d' ' -f1 "$t/schedstat" 2>/dev/null || echo 0)"; done
}
sched_delta_ms() { # BEFORE AFTER snapshots -> ms run by threads alive at the end (new ones from 0);
  # threads that exited in between are not counted (a lower bound)
  awk 'NR==FNR { a[$1]=$2; next } { d += $2 - (($1 in a) ? a[$1] : 0) } END { printf "%.3f", d/1e6 }' "$1" "$2"
}
SNAP=$(mktemp -d)
CPUIDLE=/sys/devices/system/cpu/cpu0/cpuidle
deepest_us() { # sum over CPUs of the deepest state's residency, µs
  local total=0 d
  for c in /sys/devices/system/cpu/cpu[0-9]*/cpuidle; do
    d=$(ls -d "$c"/state* | sort -V | tail -1)
    total=$((total + $(cat "$d/time")))
  done
  echo "$total"
}
residency() { # SECONDS -> percent of CPU-time in the deepest state, or "unavailable"
  if [[ ! -d $CPUIDLE ]]; then sleep "$1"; echo unavailable; return; fi
  local n a b; n=$(ls -d /sys/devices/system/cpu/cpu[0-9]*/cpuidle | wc -l)
  a=$(deepest_us); sleep "$1"; b=$(deepest_us)
  awk -v a="$a" -v b="$b" -v s="$1" -v n="$n" 'BEGIN { printf "%.1f%%", 100*(b-a)/(s*1e6*n) }'
}
wait_worker() {
  for _ in $(seq 1 300); do "$OURS" power --addr "http://127.0.0.1:$1" >/dev/null 2>&1 && \
    "$OURS" request --addr "http://127.0.0.1:$1" --text "hi" --max-tokens 1 >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "worker on $1 did not start" >&2; exit 1
}
ask() { "$OURS" request --addr "http://127.0.0.1:$1" --text "$PROMPT" --max-tokens 8 --session bench; }
field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p"; }
pct() { # P then numbers on stdin -> nearest-rank percentile
  sort -g | awk -v p="$1" '{ v[NR]=$1 } END { if (NR==0) { print "n/a"; exit } i=int((p/100)*NR+0.999999); if (i<1) i=1; printf "%.2f", v[i] }'
}

log "starting our worker (idle release 3 s) and llama-server"
"$OURS" serve --listen "127.0.0.1:$PORT_A" --model "$MODEL" --threads "$THREADS" --idle-release-ms 3000 \
  --power-backend linux 2>/tmp/idle_power_ours.log & PID_A=$!; PIDS+=("$PID_A")
"$PEER" -m "$MODEL" -t "$THREADS" --port "$PORT_PEER" -c 2048 >/tmp/idle_power_peer.log 2>&1 & PID_P=$!; PIDS+=("$PID_P")
wait_worker "$PORT_A"
for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$PORT_PEER/health" >/dev/null && break; sleep 0.2; done
ask "$PORT_A" >/dev/null
curl -sf "http://127.0.0.1:$PORT_PEER/completion" -d "{\"prompt\": \"Open the settings app.\", \"n_predict\": 8}" >/dev/null
sleep 4  # past our 3 s release

log "A: CPU time over 60 s idle"
a0=$(cpu_ms "$PID_A"); p0=$(cpu_ms "$PID_P"); sched_snap "$PID_A" >"$SNAP/a0"; sched_snap "$PID_P" >"$SNAP/p0"
RES_BOTH=$(residency 60)
a1=$(cpu_ms "$PID_A"); p1=$(cpu_ms "$PID_P"); sched_snap "$PID_A" >"$SNAP/a1"; sched_snap "$PID_P" >"$SNAP/p1"
STATE_A=$("$OURS" power --addr "http://127.0.0.1:$PORT_A" | field state)
kill "$PID_P"; wait "$PID_P" 2>/dev/null || true

log "B: cpuidle over 20 s, our worker released, nothing else"
RES_REL=$(residency 20)

log "C: cpuidle over 20 s, a second worker holding its votes"
"$OURS" serve --listen "127.0.0.1:$PORT_H" --model "$MODEL" --threads "$THREADS" --idle-release-ms 1000000000 \
  --power-backend linux 2>/tmp/idle_power_held.log & PID_H=$!; PIDS+=("$PID_H")
wait_worker "$PORT_H"; ask "$PORT_H" >/dev/null
sched_snap "$PID_H" >"$SNAP/h0"
RES_HELD=$(residency 20)
sched_snap "$PID_H" >"$SNAP/h1"

log "D: wake-up latency (6 x 5 s, 3 x 30 s pauses; 10 requests with votes held)"
W5=(); F5=(); W30=(); F30=(); WH=(); FH=()
for _ in 1 2 3 4 5 6; do sleep 5; r=$(ask "$PORT_A"); W5+=("$(field wake_ms <<<"$r")"); F5+=("$(field first_token_ms <<<"$r")"); done
for _ in 1 2 3; do sleep 30; r=$(ask "$PORT_A"); W30+=("$(field wake_ms <<<"$r")"); F30+=("$(field first_token_ms <<<"$r")"); done
for _ in $(seq 1 10); do sleep 0.5; r=$(ask "$PORT_H"); WH+=("$(field wake_ms <<<"$r")"); FH+=("$(field first_token_ms <<<"$r")"); done
POWER_A=$("$OURS" power --addr "http://127.0.0.1:$PORT_A")

row() { # label, array of values
  local label=$1; shift
  printf '| %s | %s | %s | %s |\n' "$label" "$#" "$(printf '%s\n' "$@" | pct 50)" "$(printf '%s\n' "$@" | pct 99)"
}
echo "## Idle power: device-worker vs llama-server ($(basename "$MODEL"), $THREADS threads)"
echo
echo "| figure | device-worker | llama-server |"
echo "| --- | --- | --- |"
echo "| CPU time over 60 s idle after one request, utime+stime from /proc/PID/stat (ms, ${HZ} Hz ticks) | $(awk -v a="$a0" -v b="$a1" 'BEGIN{print b-a}') (state: $STATE_A) | $(awk -v a="$p0" -v b="$p1" 'BEGIN{print b-a}') |"
echo "| same window, threads' run time from /proc/PID/task/*/schedstat (ms, ns precision; threads that exited not counted) | $(sched_delta_ms "$SNAP/a0" "$SNAP/a1") | $(sched_delta_ms "$SNAP/p0" "$SNAP/p1") |"
echo "| deepest cpuidle state residency, 60 s window, both idle | $RES_BOTH (system-wide) | |"
echo
echo "| cpuidle deepest-state residency (20 s, worker only) | value |"
echo "| --- | --- |"
echo "| votes released (idle_release 3 s) | $RES_REL |"
echo "| votes held (idle_release 10^9 ms) | $RES_HELD |"
echo "| CPU time of the held worker over those 20 s (schedstat, ms) | $(sched_delta_ms "$SNAP/h0" "$SNAP/h1") |"
echo
echo "| wake-up latency (ms) | n | p50 | p99 |"
echo "| --- | --- | --- | --- |"
row "worker wake_ms after 5 s pause" "${W5[@]}"
row "worker wake_ms after 30 s pause" "${W30[@]}"
row "worker wake_ms, votes held" "${WH[@]}"
row "client first token after 5 s pause" "${F5[@]}"
row "client first token after 30 s pause" "${F30[@]}"
row "client first token, votes held" "${FH[@]}"
echo
echo "Load average at the end (the cpuidle figures are system-wide): $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "Worker power figures at the end: \`$POWER_A\`"
