#!/usr/bin/env bash
# Static aarch64 release build of the device worker, for phones (deploy/android_worker.sh
# pushes it): glibc linked in with +crt-static, so it needs no loader or libraries on the
# device. Prints the binary's path; `file` must say "statically linked" and "ARM aarch64".
# Usage: tools/aarch64/build.sh [extra cargo args]
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/aarch64/env.sh
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
  cargo build --release --locked --target "$AARCH64_TARGET" -p device-worker "$@" >&2
bin="${CARGO_TARGET_DIR:-target}/$AARCH64_TARGET/release/device-worker"
desc="$(file -b "$bin")"
echo "aarch64: $bin: $desc" >&2
[[ "$desc" == *"ARM aarch64"* && "$desc" == *"statically linked"* ]] \
  || { echo "aarch64: $bin is not a static aarch64 executable" >&2; exit 1; }
echo "$bin"
