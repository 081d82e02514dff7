#!/usr/bin/env bash
# Compare our device-worker with the llama.cpp peer: same model, same thread count, one run.
#
# Usage: bench/compare.sh [--model GGUF] [--threads T] [--prompt-tokens 512] [--gen-tokens 64]
#                         [--reps 3] [--depth D] [--ours PATH]
# 1. bench/peer_bench.sh (llama-bench pp<prompt-tokens>, tg<gen-tokens> at depth 0 and at
#    depth <prompt-tokens>; with --depth D also pp and tg at depth D, llama-bench's -d).
# 2. PATH bench --model GGUF --threads T --prompt-tokens N --gen-tokens M --depth D --json
#    (default PATH target/release/device-worker), which prints one JSON object
#    {"prefill_tokens_per_s": x, "decode_tokens_per_s": y, "prefill_at_d_tokens_per_s": ...}.
#    --depth is what an agent step costs: its new tokens are prefilled after a reused prefix.
# 3. A table with both and the ratio ours/peer (>1 = we are faster).
# When our binary is missing it says so and prints only the peer numbers. Never run in CI.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${TANDEM_CACHE:-$HOME/.cache/tandem}"
MODEL="${TANDEM_MODEL:-$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
THREADS=2
PT=512
GT=64
REPS=3
DEPTH=0
OURS="$ROOT/target/release/device-worker"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
parse_options compare 15 --model:MODEL --threads:THREADS --prompt-tokens:PT --gen-tokens:GT --reps:REPS --depth:DEPTH --ours:OURS -- "$@"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

echo "== peer (llama.cpp llama-bench) =="
"$ROOT/bench/peer_bench.sh" --model "$MODEL" --threads "$THREADS" --prompt-sizes "$PT" --gen "$GT" \
  --reps "$REPS" --depth "$DEPTH" --json-out "$TMP/peer.json"

OURS_JSON=""
if [[ -x "$OURS" ]]; then
  echo "== ours ($OURS bench) =="
  # The last line that parses as a JSON object is taken as the result.
  "$OURS" bench --model "$MODEL" --threads "$THREADS" --prompt-tokens "$PT" --gen-tokens "$GT" \
    --repetitions "$REPS" --depth "$DEPTH" --json \
    > "$TMP/ours.out"
  OURS_JSON="$TMP/ours.out"
else
  echo
  echo "!! our binary $OURS does not exist (build it: cargo build --release -p device-worker)."
  echo "!! Showing peer numbers only."
fi

python3 - "$TMP/peer.json" "$OURS_JSON" "$PT" "$GT" "$THREADS" "$MODEL" "$DEPTH" <<'PY'
import json, os, sys
peer_path, ours_path, pt, gt, threads, model, depth = sys.argv[1:8]
peer = json.load(open(peer_path))
ours = None
if ours_path:
    for line in reversed(open(ours_path).read().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                ours = json.loads(line)
                break
            except json.JSONDecodeError:
                pass
    if ours is None:
        sys.exit("compare: our bench printed no JSON object line")
    for k in ("prefill_tokens_per_s", "decode_tokens_per_s"):
        if not isinstance(ours.get(k), (int, float)):
            sys.exit(f"compare: our bench JSON lacks numeric {k}: {ours}")

rows = [
    (f"prefill pp{pt}", peer["pp"].get(pt), ours and ours["prefill_tokens_per_s"]),
    (f"decode tg{gt} @depth 0", peer["tg"], ours and ours["decode_tokens_per_s"]),
    (f"decode tg{gt} @depth {pt}", peer["tg_at_depth"], ours and ours.get("decode_at_depth_tokens_per_s")),
]
if int(depth) > 0:
    rows += [
        (f"prefill pp{pt} @depth {depth}", peer["pp_at_d"].get(pt), ours and ours.get("prefill_at_d_tokens_per_s")),
        (f"decode tg{gt} @depth {depth}", peer["tg_at_d"], ours and ours.get("decode_at_d_tokens_per_s")),
    ]
print()
print(f"model {os.path.basename(model)}, threads {threads}")
print(f"{'metric (tok/s)':<26}{'peer':>10}{'ours':>10}{'ours/peer':>11}")
for name, p, o in rows:
    ps = f"{p:.1f}" if p is not None else "n/a"
    os_ = f"{o:.1f}" if o is not None else "n/a"
    ratio = f"{o / p:.2f}x" if (o is not None and p) else "n/a"
    print(f"{name:<26}{ps:>10}{os_:>10}{ratio:>11}")
if ours:
    print(f"(tg @depth {pt}: decode after a {pt}-token prefill, on both sides)")
PY
