#!/usr/bin/env bash
# Runs every test of the workspace against the real default model (fetched into the cache
# on first use). Used by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
TANDEM_MODEL="$(tools/fetch_model.sh)"
export TANDEM_MODEL
export TANDEM_CORPUS="${TANDEM_CORPUS:-$(cd .. && pwd)/shared/corpus/raw}"
tools/check_structure.sh
cargo test --workspace --locked "$@"
cargo build -p device-worker -p agent-gateway --locked
tools/test_python.sh
