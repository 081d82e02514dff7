#!/usr/bin/env bash
# The observability check: validates the Prometheus config and rules with promtool, runs a real
# replay (device-worker + agent-gateway on loopback, a corpus episode) while a real Prometheus
# scrapes the gateway's /metrics every second, then runs every PromQL expression of the
# dashboards and recording rules against it (check_queries.py). Fails on invalid expressions
# and on ones that return no series (except metrics listed in allow_empty.txt that are absent).
#
#   observability/check.sh            # needs: prometheus, promtool (Debian package
#                                     # `prometheus`), python3, cargo, the model and corpus
#
# Environment: TANDEM_MODEL (default: tools/fetch_model.sh), TANDEM_CORPUS
# (../shared/corpus/raw), STEPS (replayed steps, default 4), CARGO_TARGET_DIR, BASE_PORT
# (first of 5 loopback ports, default 19050). Output: observability/out/ (logs, replay JSONL,
# query results).
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in prometheus promtool python3 cargo; do
  command -v "$tool" >/dev/null || { echo "error: $tool not found (apt-get install -y prometheus python3)" >&2; exit 2; }
done
OUT=observability/out
mkdir -p "$OUT"
STEPS="${STEPS:-4}"
BASE_PORT="${BASE_PORT:-19050}"
WORKER_PORT=$BASE_PORT GATEWAY_PORT=$((BASE_PORT + 1)) HTTP_PORT=$((BASE_PORT + 2)) PROM_PORT=$((BASE_PORT + 3))
WORKER_METRICS_PORT=$((BASE_PORT + 4))
MODEL="${TANDEM_MODEL:-$(tools/fetch_model.sh)}"
CORPUS="${TANDEM_CORPUS:-../shared/corpus/raw}"

echo "== promtool" >&2
promtool check config observability/prometheus/prometheus.yml
promtool check rules observability/prometheus/rules.yml
python3 -c 'import json,sys; [json.load(open(p)) for p in sys.argv[1:]]' observability/dashboards/*.json

echo "== building" >&2
cargo build -p device-worker -p agent-gateway >&2
BIN="${CARGO_TARGET_DIR:-target}/debug"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# Prometheus with this check's ports and a 1 s scrape; the committed rules file.
prom_dir=$(mktemp -d)
cp observability/prometheus/rules.yml "$prom_dir/rules.yml"
cat >"$prom_dir/prometheus.yml" <<YML
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [rules.yml]
scrape_configs:
  - job_name: agent-gateway
    static_configs: [{targets: ["127.0.0.1:$HTTP_PORT"]}]
  - job_name: device-worker
    static_configs: [{targets: ["127.0.0.1:$WORKER_METRICS_PORT"]}]
YML
prometheus --config.file="$prom_dir/prometheus.yml" --storage.tsdb.path="$prom_dir/data" \
  --web.listen-address="127.0.0.1:$PROM_PORT" >"$OUT/prometheus.log" 2>&1 &
pids+=($!)
"$BIN/device-worker" serve --listen "127.0.0.1:$WORKER_PORT" --model "$MODEL" \
  --metrics-listen "127.0.0.1:$WORKER_METRICS_PORT" >"$OUT/worker.log" 2>&1 &
pids+=($!)
"$BIN/agent-gateway" serve --listen "127.0.0.1:$GATEWAY_PORT" --worker "http://127.0.0.1:$WORKER_PORT" \
  --http-listen "127.0.0.1:$HTTP_PORT" >"$OUT/gateway.log" 2>&1 &
pids+=($!)
"$BIN/agent-gateway" health --addr "http://127.0.0.1:$WORKER_PORT" --service tandem.step.v1.StepService --wait 180 >&2
"$BIN/agent-gateway" health --addr "http://127.0.0.1:$GATEWAY_PORT" --wait 30 >&2

echo "== replaying $STEPS step(s)" >&2
"$BIN/agent-gateway" replay --gateway "http://127.0.0.1:$GATEWAY_PORT" --corpus "$CORPUS" --count 1 \
  --max-steps "$STEPS" --out "$OUT/replay.jsonl" >"$OUT/replay.txt"
# Two more scrapes and a rule evaluation after the last step.
sleep 4
curl_metrics() { python3 -c 'import sys,urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' "$1"; }
curl_metrics "http://127.0.0.1:$HTTP_PORT/metrics" >"$OUT/gateway_metrics.txt"
promtool check metrics <"$OUT/gateway_metrics.txt" || true   # lint notes only; see README
curl_metrics "http://127.0.0.1:$WORKER_METRICS_PORT/metrics" >"$OUT/worker_metrics.txt"
promtool check metrics <"$OUT/worker_metrics.txt" || true

echo "== PromQL expressions" >&2
python3 observability/check_queries.py "http://127.0.0.1:$PROM_PORT" observability/dashboards/*.json \
  --rules observability/prometheus/rules.yml | tee "$OUT/check_queries.txt"
