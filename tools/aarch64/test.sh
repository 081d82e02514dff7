#!/usr/bin/env bash
# Cross-builds the dsp tests for aarch64 once and runs them under qemu-user at three CPU
# levels, each with the NEON backends it must have (TANDEM_REQUIRE_KERNELS: a missing one
# fails the run instead of skipping its tests):
#   cortex-a53  Armv8.0 NEON              neon
#   cortex-a76  + dotprod, fp16           neon, neon-dotprod
#   max         + i8mm (all qemu knows)   neon, neon-dotprod, neon-i8mm
# Every level also checks the cross_arch golden file (the AVX2 backend's outputs, bit for bit).
# Usage: tools/aarch64/test.sh [extra cargo test args, e.g. a test name filter]
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/aarch64/env.sh
start=$SECONDS
# --lib --tests: unit and integration tests (no doctests, no benches).
cargo test --locked --target "$AARCH64_TARGET" -p tandem-dsp --lib --tests --no-run
for level in "cortex-a53:neon" "cortex-a76:neon,neon-dotprod" "max:neon,neon-dotprod,neon-i8mm"; do
  cpu=${level%%:*}
  kernels=${level#*:}
  echo "aarch64: dsp tests under QEMU_CPU=$cpu, TANDEM_REQUIRE_KERNELS=$kernels"
  QEMU_CPU=$cpu TANDEM_REQUIRE_KERNELS=$kernels \
    cargo test -q --locked --target "$AARCH64_TARGET" -p tandem-dsp --lib --tests "$@"
done
echo "aarch64: dsp tests passed at 3 CPU levels in $((SECONDS - start)) s"
