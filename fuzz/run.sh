#!/usr/bin/env bash
# Runs the cargo-fuzz targets of fuzz/ for a given time each, one after another, and prints
# one summary line per target (executions, coverage, crashes). See --help.
set -euo pipefail
cd "$(dirname "$0")"

TARGETS=(uiautomator androidworld action gguf_reader chat_template openai_request)

usage() {
  cat <<EOF
usage: fuzz/run.sh [--smoke] TARGET|all SECONDS [-- LIBFUZZER_ARGS...]

Builds the fuzz targets (cargo +nightly fuzz build; AddressSanitizer, debug assertions) and
runs TARGET, or each of: ${TARGETS[*]}
for SECONDS seconds (libFuzzer -max_total_time), one fuzzing process at a time.

Inputs: the committed seeds (fuzz/seeds/TARGET) plus a working corpus fuzz/corpus/TARGET
(not committed) that libFuzzer grows; with --smoke the working corpus is a temporary folder,
so a run starts from the seeds alone and leaves nothing behind. Leak detection is off
(-detect_leaks=0: leaked memory is not a crash here, and the check costs a sixth of the time). A crashing input is written
to fuzz/artifacts/TARGET/ and the run of that target fails.

Output: per target, a line
  fuzz: TARGET: N executions in S s (R exec/s), cov C, ft F, crashes K
and the exit status is non-zero if any target crashed or failed to build.

Needs: the nightly toolchain (rustup toolchain install nightly) and cargo-fuzz (installed into
\$TANDEM_CACHE/cargo-fuzz, default ~/.cache/tandem/cargo-fuzz, when 'cargo fuzz' is missing).
Build folder: \$FUZZ_TARGET_DIR, default \$TANDEM_CACHE/fuzz-target. chat_template also renders
the default model's template when \$TANDEM_MODEL (or the default model in the cache) exists.
Extra arguments after -- go to libFuzzer (e.g. -- -runs=1000000 -max_len=4096).
EOF
}

smoke=0
if [[ "${1:-}" == "--smoke" ]]; then smoke=1; shift; fi
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  usage
  exit 0
fi
if [[ $# -lt 2 ]]; then
  usage >&2
  exit 2
fi
which=$1 seconds=$2
shift 2
if [[ $# -gt 0 ]]; then
  [[ "$1" == "--" ]] || { echo "run.sh: unexpected argument '$1' (libFuzzer arguments go after --)" >&2; exit 2; }
  shift
fi
# libFuzzer's -max_total_time=0 means no limit: a run here always has one.
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: SECONDS must be a whole number of at least 1, got '$seconds'" >&2; exit 2; }
if [[ "$which" == all ]]; then
  run_targets=("${TARGETS[@]}")
elif [[ " ${TARGETS[*]} " == *" $which "* ]]; then
  run_targets=("$which")
else
  echo "run.sh: unknown target '$which' (one of: ${TARGETS[*]}, all)" >&2
  exit 2
fi

cargo +nightly --version >/dev/null 2>&1 || { echo "run.sh: no nightly toolchain (cargo +nightly)" >&2; exit 3; }
export TANDEM_CACHE="${TANDEM_CACHE:-$HOME/.cache/tandem}"
if ! cargo fuzz --version >/dev/null 2>&1; then
  export PATH="$TANDEM_CACHE/cargo-fuzz/bin:$PATH"
  if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "run.sh: installing cargo-fuzz into $TANDEM_CACHE/cargo-fuzz" >&2
    cargo install cargo-fuzz --locked --root "$TANDEM_CACHE/cargo-fuzz" >&2
  fi
fi
target_dir="${FUZZ_TARGET_DIR:-$TANDEM_CACHE/fuzz-target}"
build=(--target-dir "$target_dir" --codegen-units 16)

build_start=$SECONDS
cargo +nightly fuzz build "${build[@]}" >&2
echo "fuzz: build took $((SECONDS - build_start)) s" >&2

status=0
for t in "${run_targets[@]}"; do
  if (( smoke )); then
    work=$(mktemp -d)
  else
    work="corpus/$t"
    mkdir -p "$work"
  fi
  mkdir -p "artifacts/$t"
  log=$(mktemp)
  start=$SECONDS
  rc=0
  cargo +nightly fuzz run "${build[@]}" "$t" "$work" "seeds/$t" -- \
    -max_total_time="$seconds" -timeout=10 -detect_leaks=0 -print_final_stats=1 \
    -artifact_prefix="artifacts/$t/" "$@" >"$log" 2>&1 || rc=$?
  took=$((SECONDS - start))
  runs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1 || true)
  rate=$(grep -oE '^stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1 || true)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(grep -oE 'cov: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)
  ft=$(grep -oE 'ft: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)
  crashes=0
  if (( rc != 0 )); then
    crashes=1
    status=1
    echo "fuzz: $t FAILED (exit $rc); the end of its log:" >&2
    tail -40 "$log" >&2
    ls "artifacts/$t" >&2 || true
  fi
  echo "fuzz: $t: ${runs:-?} executions in $took s (${rate:-?} exec/s), cov ${cov:-?}, ft ${ft:-?}, crashes $crashes"
  rm -f "$log"
  (( smoke )) && rm -rf "$work"
done
exit $status
