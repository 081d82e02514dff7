#!/usr/bin/env bash
# Build the llama.cpp peer (reference implementation and benchmark baseline).
#
# Source: the PyPI source distribution of llama-cpp-python==0.3.36, whose
# vendor/llama.cpp/ folder carries the full llama.cpp tree (server, bench, tools).
# Output: ${TANDEM_CACHE:-$HOME/.cache/tandem}/peer/llama-cpp-python-0.3.36/vendor/llama.cpp/build/bin/
#
# CPU features: never GGML_NATIVE=ON. On machines whose CPU lists amx_tile/amx_int8 but whose
# VM does not allow AMX, a native build runs AMX code and dies with SIGILL. The x86 feature
# flags are set explicitly from /proc/cpuinfo (SSE4.2, AVX, AVX2, BMI2, FMA, F16C, AVX-512
# F/VBMI/VNNI/BF16 where present; AMX always off), so the binaries run on every machine here
# with those features.
#
# Idempotent: skips download, unpack, configure and build when their results already exist.
# A build folder configured with other flags (e.g. an older GGML_NATIVE=ON build) is
# reconfigured and rebuilt. Before reporting success the built llama-bench must run: `--help`
# and a tiny pp8/tg4 run on the default model (fetched by tools/fetch_model.sh if missing).
# Takes ~15-30 minutes on 2 cores. Never run in CI.
#
# Env:
#   TANDEM_CACHE      cache root (default $HOME/.cache/tandem)
#   PEER_JOBS         parallel build jobs (default 2)
#   PEER_NICE         nice level for the build (default 10)
#   PEER_CHECK_MODEL  GGUF for the llama-bench check (default: TANDEM_MODEL, else the default
#                     model from tools/fetch_model.sh); PEER_CHECK_MODEL=none skips the tiny
#                     run and checks `llama-bench --help` only
#   PEER_CPUINFO      file read for the CPU flags (default /proc/cpuinfo; for testing)
#
# `build_llama_cpp.sh --print-flags` prints the configure arguments for this CPU and exits.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VERSION="0.3.36"
CACHE="${TANDEM_CACHE:-$HOME/.cache/tandem}"
PEER_DIR="$CACHE/peer"
SRC_DIR="$PEER_DIR/llama-cpp-python-$VERSION"
LLAMA_DIR="$SRC_DIR/vendor/llama.cpp"
BUILD_DIR="$LLAMA_DIR/build"
BIN_DIR="$BUILD_DIR/bin"
STAMP="$BUILD_DIR/tandem-configure-args.txt"
JOBS="${PEER_JOBS:-2}"
NICE="${PEER_NICE:-10}"
WANTED_TARGETS=(llama-server llama-cli llama-bench llama-quantize llama-mtmd-cli llama-tokenize llama-simple)
REQUIRED_TARGETS=(llama-server llama-bench llama-quantize)

log() { echo "[build_llama_cpp $(date +%H:%M:%S)] $*"; }

# Prints the path of the downloaded sdist (either name spelling), or nothing.
find_sdist() {
  local f
  for f in "$PEER_DIR/llama_cpp_python-$VERSION.tar.gz" "$PEER_DIR/llama-cpp-python-$VERSION.tar.gz"; do
    if [[ -f "$f" ]]; then echo "$f"; return 0; fi
  done
  return 0
}

# --- configure arguments (deterministic for a given CPU) --------------------------
CPU_FLAGS=" $(grep -m1 -E '^flags[[:space:]]*:' "${PEER_CPUINFO:-/proc/cpuinfo}" 2>/dev/null | cut -d: -f2-) "
has() { local f; for f in "$@"; do [[ "$CPU_FLAGS" == *" $f "* ]] || return 1; done; }
onoff() { if has "$@"; then echo ON; else echo OFF; fi; }

CONFIG_ARGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DLLAMA_CURL=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=ON
  -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_SERVER=ON
  -DBUILD_SHARED_LIBS=OFF
  -DGGML_NATIVE=OFF
)
case "$(uname -m)" in
  x86_64|amd64)
    avx512=$(onoff avx512f avx512cd avx512vl avx512dq avx512bw)
    sub512() { if [[ $avx512 == ON ]]; then onoff "$@"; else echo OFF; fi; }
    CONFIG_ARGS+=(
      -DGGML_SSE42="$(onoff sse4_2)"
      -DGGML_AVX="$(onoff avx)"
      -DGGML_AVX2="$(onoff avx2)"
      -DGGML_BMI2="$(onoff bmi2)"
      -DGGML_FMA="$(onoff fma)"
      -DGGML_F16C="$(onoff f16c)"
      -DGGML_AVX512="$avx512"
      -DGGML_AVX512_VBMI="$(sub512 avx512vbmi)"
      -DGGML_AVX512_VNNI="$(sub512 avx512_vnni)"
      -DGGML_AVX512_BF16="$(sub512 avx512_bf16)"
      -DGGML_AMX_TILE=OFF
      -DGGML_AMX_INT8=OFF
      -DGGML_AMX_BF16=OFF
    )
    ;;
  *)
    # No AMX elsewhere; the generic (non-native) baseline of the compiler is used.
    log "note: $(uname -m) is not x86_64; building with GGML_NATIVE=OFF and the compiler's baseline"
    ;;
esac
WANT_STAMP="$(printf '%s\n' "${CONFIG_ARGS[@]}")"
if [[ "${1:-}" == --print-flags ]]; then
  echo "${CONFIG_ARGS[*]}"
  exit 0
fi

# --- the check: the built llama-bench must run ------------------------------------
check_bench() {
  local bench="$BIN_DIR/llama-bench" rc=0 model out
  [[ -x "$bench" ]] || { log "error: $bench missing"; return 1; }
  out="$("$bench" --help 2>&1)" || rc=$?
  if [[ $rc -ne 0 ]] || ! grep -q -- "--model" <<<"$out"; then
    log "error: '$bench --help' failed (exit $rc$( ((rc > 128)) && echo ", signal $((rc - 128))"))"
    tail -n 20 <<<"$out" >&2
    return 1
  fi
  model="${PEER_CHECK_MODEL:-${TANDEM_MODEL:-}}"
  if [[ "$model" == none ]]; then
    log "check: llama-bench --help ran (tiny run skipped: PEER_CHECK_MODEL=none)"
    return 0
  fi
  if [[ -z "$model" ]]; then
    model="$(TANDEM_CACHE="$CACHE" "$HERE/../fetch_model.sh")" || { log "error: could not fetch the default model for the check"; return 1; }
  fi
  [[ -f "$model" ]] || { log "error: check model $model not found"; return 1; }
  rc=0
  out="$("$bench" -m "$model" -t 2 -p 8 -n 4 -r 1 -o md 2>&1)" || rc=$?
  if [[ $rc -ne 0 ]] || ! grep -q "tg4" <<<"$out"; then
    log "error: tiny llama-bench run on $model failed (exit $rc$( ((rc > 128)) && echo ", signal $((rc - 128)); SIGILL means an instruction this CPU/VM refuses"))"
    tail -n 20 <<<"$out" >&2
    return 1
  fi
  log "check: llama-bench runs (pp8/tg4 on $(basename "$model")):"
  grep -E "^\|" <<<"$out" | sed 's/^/  /'
}

mkdir -p "$PEER_DIR"

# --- skip when already built with these flags and working ------------------------
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT_STAMP" ]]; then
  all_built=1
  for t in "${REQUIRED_TARGETS[@]}"; do
    [[ -x "$BIN_DIR/$t" ]] || all_built=0
  done
  if [[ $all_built == 1 ]] && check_bench; then
    log "binaries already built with these flags in $BIN_DIR; nothing to do"
    ls -1 "$BIN_DIR" | sed 's/^/  /'
    exit 0
  fi
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

# --- configure (again when the build folder was configured with other flags) ----
if [[ -f "$BUILD_DIR/CMakeCache.txt" ]] && ! [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT_STAMP" ]]; then
  log "build folder was configured with other flags; reconfiguring (objects are rebuilt where flags changed)"
  rm -f "$BUILD_DIR/CMakeCache.txt" "$STAMP"
fi
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  log "configuring: ${CONFIG_ARGS[*]}"
  nice -n "$NICE" cmake -S "$LLAMA_DIR" -B "$BUILD_DIR" "${CONFIG_ARGS[@]}"
  printf '%s\n' "$WANT_STAMP" >"$STAMP"
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

# --- check ------------------------------------------------------------------------
check_bench || { log "error: the build does not run on this machine (flags: ${CONFIG_ARGS[*]})"; exit 1; }
log "peer ready in $BIN_DIR"
