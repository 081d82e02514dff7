#!/usr/bin/env bash
# Benchmark the llama.cpp peer with llama-bench: prompt processing (prefill) and decode speed.
#
# Usage: bench/peer_bench.sh [--model GGUF] [--threads T] [--prompt-sizes 512,800]
#                            [--gen 64] [--reps 3] [--depth D] [--json-out FILE]
# Runs
#   llama-bench -m MODEL -t T -p 512,800 -n 64 -r 3 -o json          (pp512, pp800, tg64 at depth 0)
#   llama-bench -m MODEL -t T -p 0 -n 64 -d 512 -r 3 -o json         (tg64 after a 512-token context)
# and, with --depth D (an agent step prefills after a reused prefix),
#   llama-bench -m MODEL -t T -p 512 -n 64 -d D -r 3 -o json         (pp512 and tg64 at depth D)
# and prints prompt tok/s and decode tok/s. --json-out writes
#   {"threads": T, "model": path, "pp": {"512": tok/s, ...}, "tg": tok/s, "tg_at_depth": tok/s,
#    "depth": D, "pp_at_d": {"512": tok/s}, "tg_at_d": tok/s,
#    "prefill_tokens_per_s": pp512, "decode_tokens_per_s": tg}
# Needs the peer build (tools/peer/build_llama_cpp.sh). ~1 minute for SmolLM2-135M on 2 threads.
# Never run in CI.
set -euo pipefail
CACHE="${TANDEM_CACHE:-$HOME/.cache/tandem}"
BIN="${LLAMA_BENCH:-$CACHE/peer/llama-cpp-python-0.3.36/vendor/llama.cpp/build/bin/llama-bench}"
MODEL="${TANDEM_MODEL:-$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
THREADS=2
PROMPTS="512,800"
GEN=64
REPS=3
JSON_OUT=""
D=0
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
parse_options peer_bench 17 --model:MODEL --threads:THREADS --prompt-sizes:PROMPTS --gen:GEN --reps:REPS --depth:D --json-out:JSON_OUT -- "$@"
[[ -x "$BIN" ]] || { echo "peer_bench: $BIN missing; run tools/peer/build_llama_cpp.sh" >&2; exit 1; }
[[ -f "$MODEL" ]] || { echo "peer_bench: model $MODEL missing" >&2; exit 1; }
DEPTH="${PROMPTS%%,*}"

# Other processes on the cores distort llama-bench badly (its threads spin-wait on each other):
# warn when the 1-minute load average is above half the core count.
read -r LOAD1 _ < /proc/loadavg
NCPU="$(nproc)"
if python3 -c "import sys; sys.exit(0 if float('$LOAD1') > $NCPU / 2 else 1)"; then
  echo "peer_bench: WARNING load average $LOAD1 on $NCPU cores before the run; numbers will be low" >&2
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo "peer_bench: $(basename "$MODEL"), threads=$THREADS, pp=$PROMPTS, tg=$GEN (depth 0 and $DEPTH), reps=$REPS" >&2
"$BIN" -m "$MODEL" -t "$THREADS" -p "$PROMPTS" -n "$GEN" -r "$REPS" -o json > "$TMP/a.json" 2> "$TMP/a.err" \
  || { cat "$TMP/a.err" >&2; exit 1; }
"$BIN" -m "$MODEL" -t "$THREADS" -p 0 -n "$GEN" -d "$DEPTH" -r "$REPS" -o json > "$TMP/b.json" 2> "$TMP/b.err" \
  || { cat "$TMP/b.err" >&2; exit 1; }

echo "[]" > "$TMP/c.json"
if [[ "$D" -gt 0 ]]; then
  "$BIN" -m "$MODEL" -t "$THREADS" -p "${PROMPTS%%,*}" -n "$GEN" -d "$D" -r "$REPS" -o json > "$TMP/c.json" 2> "$TMP/c.err" \
    || { cat "$TMP/c.err" >&2; exit 1; }
fi
python3 - "$TMP/a.json" "$TMP/b.json" "$THREADS" "$MODEL" "$JSON_OUT" "$DEPTH" "$TMP/c.json" "$D" <<'PY'
import json, sys
a, b, threads, model, json_out, depth, c, d = sys.argv[1:9]
rows = json.load(open(a)) + json.load(open(b))
pp_d, tg_at_d = {}, None
for r in json.load(open(c)):
    if r["n_gen"] == 0:
        pp_d[str(r["n_prompt"])] = (r["avg_ts"], r["stddev_ts"])
    else:
        tg_at_d = (r["avg_ts"], r["stddev_ts"])
pp, tg, tg_d = {}, None, None
for r in rows:
    if r["n_gen"] == 0 and r["n_prompt"] > 0:
        pp[str(r["n_prompt"])] = (r["avg_ts"], r["stddev_ts"])
    elif r["n_prompt"] == 0 and r["n_depth"] == 0:
        tg = (r["avg_ts"], r["stddev_ts"])
    elif r["n_prompt"] == 0:
        tg_d = (r["avg_ts"], r["stddev_ts"])
gen = rows[-1]["n_gen"]
print(f"{'test':<22}{'tok/s':>10}{'± sd':>9}")
for n, (m, s) in pp.items():
    print(f"{'prompt pp' + n:<22}{m:>10.1f}{s:>9.1f}")
if tg:
    print(f"{'decode tg' + str(gen):<22}{tg[0]:>10.1f}{tg[1]:>9.1f}")
if tg_d:
    print(f"{'decode tg' + str(gen) + ' @d' + depth:<22}{tg_d[0]:>10.1f}{tg_d[1]:>9.1f}")
for n, (m, s) in pp_d.items():
    print(f"{'prompt pp' + n + ' @d' + d:<22}{m:>10.1f}{s:>9.1f}")
if tg_at_d:
    print(f"{'decode tg' + str(gen) + ' @d' + d:<22}{tg_at_d[0]:>10.1f}{tg_at_d[1]:>9.1f}")
print(f"(cpu: {rows[0].get('cpu_info', '?')}; build {rows[0].get('build_commit', '?')}; threads {threads};"
      f" load average after run {open('/proc/loadavg').read().split()[0]})")
if json_out:
    first_pp = next(iter(pp.values()))[0] if pp else None
    json.dump({
        "threads": int(threads), "model": model,
        "pp": {k: v[0] for k, v in pp.items()},
        "tg": tg[0] if tg else None, "tg_depth": int(depth), "tg_at_depth": tg_d[0] if tg_d else None,
        "depth": int(d), "pp_at_d": {k: v[0] for k, v in pp_d.items()},
        "tg_at_d": tg_at_d[0] if tg_at_d else None,
        "prefill_tokens_per_s": first_pp, "decode_tokens_per_s": tg[0] if tg else None,
    }, open(json_out, "w"), indent=1)
PY
