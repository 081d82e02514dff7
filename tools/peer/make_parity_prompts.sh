#!/usr/bin/env bash
# Writes the parity prompts: chat prompts built from corpus screens by the gateway's prompt
# builder and rendered with the model's chat template, one raw text file each, into
# device-worker/tests/fixtures/parity/prompts/. Then run tools/peer/parity_fixtures.sh to
# get llama.cpp's greedy tokens for them.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL="${TANDEM_MODEL:-$(tools/fetch_model.sh)}"
OUT=device-worker/tests/fixtures/parity/prompts
mkdir -p "$OUT"
cargo build --release --locked -p device-worker -p agent-gateway >&2
BIN="${CARGO_TARGET_DIR:-target}/release"
# episode id, step, fixture name
while read -r episode step name; do
  "$BIN/agent-gateway" prompt --episode "$episode" --step "$step" 2>/dev/null \
    | "$BIN/device-worker" render --model "$MODEL" > "$OUT/$name.txt"
  echo "wrote $OUT/$name.txt ($(wc -c < "$OUT/$name.txt") bytes)" >&2
done <<'LIST'
llamatouch/trace_7 0 llamatouch_trace7_step0
llamatouch/trace_7 5 llamatouch_trace7_step5
llamatouch/trace_18 2 llamatouch_trace18_step2
androidworld/ContactsAddContact_base_o4-mini_trial1 1 androidworld_contacts_step1
LIST
