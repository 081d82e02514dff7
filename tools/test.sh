#!/usr/bin/env bash
# Runs every test of the workspace against the real default model (fetched into the cache
# on first use). Used by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
TANDEM_MODEL="$(tools/fetch_model.sh)"
export TANDEM_MODEL
export TANDEM_CORPUS="${TANDEM_CORPUS:-$(cd .. && pwd)/shared/corpus/raw}"
# Every test input is required here, and so in CI: a missing model, corpus or fixture fails
# its test (Rust: test-support's inputs.rs; pytest: clients/python/tests/conftest.py), and so
# does a SIMD kernel backend the CPU flags promise that the build does not provide.
export TANDEM_REQUIRE_INPUTS=1
if [[ -z "${TANDEM_REQUIRE_KERNELS+set}" ]]; then
  # The rule of test_support::inputs::cpuinfo_kernels.
  flags=" $(grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  has() { local f; for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done; }
  kernels=()
  if has avx2 fma f16c; then
    kernels+=(avx2)
    if has avx512f avx512bw avx512dq avx512vl avx512_vnni; then kernels+=(avx512-vnni); fi
  fi
  if has asimd; then kernels+=(neon); fi
  TANDEM_REQUIRE_KERNELS=$(IFS=,; echo "${kernels[*]}")
fi
export TANDEM_REQUIRE_KERNELS
echo "test.sh: TANDEM_REQUIRE_INPUTS=1 TANDEM_REQUIRE_KERNELS=$TANDEM_REQUIRE_KERNELS" >&2
tools/check_structure.sh
cargo test --workspace --locked "$@"
cargo build -p device-worker -p agent-gateway --locked
tools/test_python.sh
