#!/usr/bin/env bash
# Build the llama.cpp peer (reference implementation and benchmark baseline).
#
# Source: the PyPI source distribution of llama-cpp-python==0.3.36, whose
# vendor/llama.cpp/ folder carries the full llama.cpp tree (server, bench, tools).
# Output: ${TANDEM_CACHE:-$HOME/.cache/tandem}/peer/llama-cpp-python-0.3.36/vendor/llama.cpp/build/bin/
#
# Idempotent: skips download, unpack and build when their results already exist.
# Takes ~15+ minutes on 2 cores. Never run in CI.
#
# Env:
#   TANDEM_CACHE   cache root (default $HOME/.cache/tandem)
#   PEER_JOBS      parallel build jobs (default 2)
#   PEER_NICE      nice level for the build (default 10)
set -euo pipefail

VERSION="0.3.36"
CACHE="${TANDEM_CACHE:-$HOME/.cache/tandem}"
PEER_DIR="$CACHE/peer"
SRC_DIR="$PEER_DIR/llama-cpp-python-$VERSION"
LLAMA_DIR="$SRC_DIR/vendor/llama.cpp"
BUILD_DIR="$LLAMA_DIR/build"
BIN_DIR="$BUILD_DIR/bin"
JOBS="${PEER_JOBS:-2}"
NICE="${PEER_NICE:-10}"
WANTED_TARGETS=(llama-server llama-cli llama-bench llama-tokenize llama-simple)
REQUIRED_TARGETS=(llama-server llama-bench)

log() { echo "[build_llama_cpp $(date +%H:%M:%S)] $*"; }

# Prints the path of the downloaded sdist (either name spelling), or nothing.
find_sdist() {
  local f
  for f in "$PEER_DIR/llama_cpp_python-$VERSION.tar.gz" "$PEER_DIR/llama-cpp-python-$VERSION.tar.gz"; do
    if [[ -f "$f" ]]; then echo "$f"; return 0; fi
  done
  return 0
}

mkdir -p "$PEER_DIR"

# --- skip when already built -------------------------------------------------
all_built=1
for t in "${REQUIRED_TARGETS[@]}"; do
  [[ -x "$BIN_DIR/$t" ]] || all_built=0
done
if [[ $all_built == 1 ]]; then
  log "binaries already present in $BIN_DIR; nothing to do"
  ls -1 "$BIN_DIR" | sed 's/^/  /'
  exit 0
fi

# --- cmake --------------------------------------------------------------------
if ! command -v cmake >/dev/null 2>&1; then
  log "cmake missing; installing from Debian packages"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y cmake
fi
log "$(cmake --version | head -n1)"

# --- download + unpack the sdist ---------------------------------------------
if [[ ! -f "$LLAMA_DIR/CMakeLists.txt" ]]; then
  SDIST="$(find_sdist)"
  if [[ -z "$SDIST" ]]; then
    log "downloading llama-cpp-python==$VERSION source distribution"
    # `--no-binary llama-cpp-python` (not `:all:`): pip prepares the sdist's metadata in
    # an isolated env, and `:all:` would force its build backend's own dependencies
    # (the `cmake` PyPI package) to be compiled from source too, which takes an hour
    # on 2 cores. With a system cmake present the backend needs no cmake wheel at all.
    python3 -m pip download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$PEER_DIR"
    SDIST="$(find_sdist)"
    [[ -n "$SDIST" ]] || { log "error: pip download produced no sdist in $PEER_DIR"; exit 1; }
  fi
  log "unpacking $SDIST"
  tar -xzf "$SDIST" -C "$PEER_DIR"
  # The sdist's top folder may use either spelling; normalise to $SRC_DIR.
  if [[ ! -d "$SRC_DIR" && -d "$PEER_DIR/llama_cpp_python-$VERSION" ]]; then
    mv "$PEER_DIR/llama_cpp_python-$VERSION" "$SRC_DIR"
  fi
  [[ -f "$LLAMA_DIR/CMakeLists.txt" ]] || { log "error: $LLAMA_DIR/CMakeLists.txt missing after unpack"; exit 1; }
else
  log "source already unpacked at $SRC_DIR"
fi

# --- configure ------------------------------------------------------------------
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  log "configuring (Release, GGML_NATIVE=ON, LLAMA_CURL=OFF)"
  nice -n "$NICE" cmake -S "$LLAMA_DIR" -B "$BUILD_DIR" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=ON \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON \
    -DBUILD_SHARED_LIBS=OFF
fi

# --- pick the targets this tree actually defines --------------------------------
available="$(cmake --build "$BUILD_DIR" --target help 2>/dev/null || true)"
targets=()
for t in "${WANTED_TARGETS[@]}"; do
  if grep -qE "(^|[ .:])$t(:|$| )" <<<"$available"; then
    targets+=("$t")
  else
    log "target $t not defined in this tree; skipping"
  fi
done
for t in "${REQUIRED_TARGETS[@]}"; do
  [[ " ${targets[*]} " == *" $t "* ]] || { log "error: required target $t not defined"; exit 1; }
done

# --- build ------------------------------------------------------------------------
log "building ${targets[*]} with -j$JOBS (nice $NICE)"
start=$(date +%s)
nice -n "$NICE" cmake --build "$BUILD_DIR" --config Release -j"$JOBS" --target "${targets[@]}"
log "build finished in $(( $(date +%s) - start )) s"
ls -1 "$BIN_DIR" | sed 's/^/  /'
