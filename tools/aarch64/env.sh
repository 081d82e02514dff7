# Sourced by tools/aarch64/*.sh: checks the aarch64 cross toolchain (installed by .ci/run:
# Debian gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user; rustup target
# aarch64-unknown-linux-gnu) and fails with what is missing. The linker and the qemu runner
# are set in .cargo/config.toml.
AARCH64_TARGET=aarch64-unknown-linux-gnu
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
aarch64_missing=()
command -v aarch64-linux-gnu-gcc >/dev/null || aarch64_missing+=("aarch64-linux-gnu-gcc (apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross)")
command -v qemu-aarch64 >/dev/null || aarch64_missing+=("qemu-aarch64 (apt-get install qemu-user)")
[[ -d /usr/aarch64-linux-gnu/lib ]] || aarch64_missing+=("/usr/aarch64-linux-gnu (apt-get install libc6-dev-arm64-cross)")
if [[ -z "${RUSTC:-}" ]] && command -v rustup >/dev/null; then
  rustup target list --installed 2>/dev/null | grep -qx "$AARCH64_TARGET" \
    || aarch64_missing+=("rust-std for $AARCH64_TARGET (rustup target add $AARCH64_TARGET)")
fi
if (( ${#aarch64_missing[@]} )); then
  echo "aarch64: missing: ${aarch64_missing[*]}" >&2
  exit 2
fi
