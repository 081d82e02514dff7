#!/usr/bin/env bash
# The aarch64 speed proxy (issue 18, item 4): static hot-loop instruction counts of our
# dotprod-level dot products (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) side by side with llama.cpp's
# NEON kernels (ggml-cpu/arch/arm/quants.c of llama-cpp-python 0.3.36's vendored llama.cpp,
# the peer of tools/peer/build_llama_cpp.sh) compiled with the same cross gcc at -O3
# -march=armv8.2-a+dotprod, as a Markdown table; then the 4-column Q4_K verification tile
# against one column (executed instructions under qemu, see there).
# The hot loop of a function is found by tools/aarch64/insn_loops.py (the innermost backward-
# branch range holding its sdot instructions; a static range, so cold paths inside it count
# too); "per 256 weights" divides by the blocks one iteration handles (sdots / sdots per
# block: 2 per 32-weight block, 16 per 256-weight super-block, per column).
# Needs: the aarch64 toolchain (tools/aarch64/env.sh), pip (downloads the sdist once into
# ${TANDEM_CACHE:-$HOME/.cache/tandem}/peer; no llama.cpp code enters the repo).
# Usage: tools/aarch64/insn_table.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/aarch64/env.sh
here=tools/aarch64
peer="${TANDEM_CACHE:-$HOME/.cache/tandem}/peer"
version=0.3.36
mkdir -p "$peer"
sdist=""
for f in "$peer/llama_cpp_python-$version.tar.gz" "$peer/llama-cpp-python-$version.tar.gz"; do
  [[ -f $f ]] && sdist=$f
done
if [[ -z $sdist ]]; then
  # --no-binary for this package only: its build backend's own dependencies (cmake) may be
  # wheels, else pip builds cmake from source just to read the metadata.
  pip download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$version" -d "$peer" >&2
  sdist=$(ls "$peer"/llama[_-]cpp[_-]python-"$version".tar.gz | head -1)
fi
src=""
for d in "$peer/llama-cpp-python-$version" "$peer/llama_cpp_python-$version"; do
  [[ -f $d/vendor/llama.cpp/ggml/src/ggml-cpu/arch/arm/quants.c ]] && src=$d
done
if [[ -z $src ]]; then
  tar -xzf "$sdist" -C "$peer"
  src=$(ls -d "$peer"/llama[_-]cpp[_-]python-"$version" | head -1)
fi
ggml=$src/vendor/llama.cpp/ggml
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# llama.cpp's ARM quants at the dotprod level.
aarch64-linux-gnu-gcc -O3 -march=armv8.2-a+dotprod -std=c11 -D_GNU_SOURCE -DNDEBUG \
  -I"$ggml/include" -I"$ggml/src" -I"$ggml/src/ggml-cpu" \
  -c "$ggml/src/ggml-cpu/arch/arm/quants.c" -o "$work/quants.o"
aarch64-linux-gnu-objdump -d --no-show-raw-insn "$work/quants.o" >"$work/llama.dis"

# Our dsp crate, release, with v0 symbol names (they carry the generic arguments: the
# pair_dot::<KIND> single dots, KIND 0 = Q4_0, 1 = Q4_1, 2 = Q8_0); its own target dir
# (other RUSTFLAGS).
tdir="${CARGO_TARGET_DIR:-target}/insn-table"
RUSTFLAGS="${RUSTFLAGS:-} -C symbol-mangling-version=v0" CARGO_TARGET_DIR="$tdir" \
  cargo build --release --locked --target "$AARCH64_TARGET" -p tandem-dsp >&2
aarch64-linux-gnu-objdump -d --no-show-raw-insn -C "$tdir/$AARCH64_TARGET/release/libdsp.rlib" \
  >"$work/ours.dis" 2>/dev/null

# loop DIS FUNCTION SDOT_PER_BLOCK BLOCK_WEIGHTS [insn_loops.py args]: "insns blocks per256".
loop() {
  local dis=$1 fn=$2 per=$3 bw=$4
  shift 4
  python3 "$here/insn_loops.py" "$dis" "$fn" "$@" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read()); per, bw = int(sys.argv[1]), int(sys.argv[2])
if "error" in d: sys.exit(d["function"] + ": " + d["error"])
blocks = d["sdot"] / per
print(d["insns"], "%g" % blocks, "%.0f" % (d["insns"] / blocks * 256 / bw), d["inner_loops"])' "$per" "$bw"
}

n="dsp::backend::neon"
echo "| type | ours: insns / 256 weights (neon-dotprod) | llama.cpp (armv8.2-a+dotprod) | ours / llama.cpp | ours: loop insns × blocks/iter (inner loops) | llama.cpp: loop insns × blocks/iter |"
echo "|---|---|---|---|---|---|"
row() {
  local ty=$1 ours_fn=$2 ours_args=$3 llama_fn=$4 per=$5 bw=$6
  read -r oi ob op oin < <(loop "$work/ours.dis" "$ours_fn" "$per" "$bw" $ours_args)
  read -r li lb lp lin < <(loop "$work/llama.dis" "$llama_fn" "$per" "$bw")
  echo "| $ty | $op | $lp | $(python3 -c "print('%.2f' % ($op / $lp))") | $oi × $ob ($oin) | $li × $lb |"
  [[ $ty == Q4_K ]] && one_q4k=$oi || true
  [[ $ty == Q6_K ]] && one_q6k=$oi || true
}
row Q4_0 "$n::pair_dot::<0>" "" ggml_vec_dot_q4_0_q8_0 2 32
row Q4_1 "$n::pair_dot::<1>" "" ggml_vec_dot_q4_1_q8_1 2 32
row Q8_0 "$n::pair_dot::<2>" "" ggml_vec_dot_q8_0_q8_0 2 32
row Q4_K "${n}_kquants::single_dot" "--without smull2" ggml_vec_dot_q4_K_q8_K 16 256
row Q6_K "${n}_kquants::single_dot" "--with smull2" ggml_vec_dot_q6_K_q8_K 16 256
# The 4-column verification tile: Q4_K dot_tile of 1 row x 4 tokens. Its sweep runs row and
# token loops with run-time bounds, so no one static loop range holds its hot path; it is
# counted dynamically instead (tools/aarch64/insn_exec.py: qemu with one instruction per
# translation block, every executed instruction of one call of the kernel function,
# callees included), on a driver (dsp/examples/neon_insn_driver.rs) at QEMU_CPU=cortex-a76
# (neon-dotprod), for 2 and 6 super-blocks: the difference / 4 is the cost of one
# super-block (the call's fixed cost cancels); the neon-i8mm tile likewise at QEMU_CPU=max
# (per weight row). The single Q4_K dot is counted the same way,
# which also checks the method against the static count of its loop above.
RUSTFLAGS="${RUSTFLAGS:-} -C symbol-mangling-version=v0" CARGO_TARGET_DIR="$tdir" \
  cargo build --release --locked --target "$AARCH64_TARGET" -p tandem-dsp --example neon_insn_driver >&2
driver="$tdir/$AARCH64_TARGET/release/examples/neon_insn_driver"
# per_block MODE FUNCTION: dynamic instructions per super-block of one call.
per_block() {
  local a b
  a=$(QEMU_CPU=cortex-a76 python3 "$here/insn_exec.py" "$driver" "${n}_kquants::$2" "$1" 2)
  b=$(QEMU_CPU=cortex-a76 python3 "$here/insn_exec.py" "$driver" "${n}_kquants::$2" "$1" 6)
  python3 -c 'import json, sys; a, b = (json.loads(v)["insns"] for v in sys.argv[1:]); print("%g" % ((b - a) / 4))' "$a" "$b"
}
dyn_one=$(per_block single single_dot)
dyn_tile=$(per_block tile4 tile_dot)
# The neon-i8mm tile (smmla register tiles of 2 weight rows x 4 tokens, Q4_K 4 rows while 4
# are left; the activations packed once per call): ROWS weight rows x 4 tokens at
# QEMU_CPU=max, per row; 2 rows (one register tile, the packing paid by 2 rows) and 16 rows
# (a pool task's share: the packing amortized). TYPE q4_k or q6_k.
per_row_i8mm() {
  local rows=$1 ty=$2 a b
  a=$(QEMU_CPU=max python3 "$here/insn_exec.py" "$driver" dsp::backend::neon_i8mm::dot_tile_kquant tile4-i8mm 2 "$rows" "$ty")
  b=$(QEMU_CPU=max python3 "$here/insn_exec.py" "$driver" dsp::backend::neon_i8mm::dot_tile_kquant tile4-i8mm 6 "$rows" "$ty")
  python3 -c 'import json, sys; a, b = (json.loads(v)["insns"] for v in sys.argv[2:]); print("%g" % ((b - a) / 4 / int(sys.argv[1])))' "$rows" "$a" "$b"
}
i8_2=$(per_row_i8mm 2 q4_k)
i8_16=$(per_row_i8mm 16 q4_k)
q6_2=$(per_row_i8mm 2 q6_k)
q6_16=$(per_row_i8mm 16 q6_k)
echo
python3 -c '
import sys
tile, one, one_dyn, i2, i16, q6one, q2, q16 = (float(v) for v in sys.argv[1:])
print("4-column tiles, executed instructions per super-block and weight row (qemu), against one "
      "column (its static loop above, neon-dotprod; target ≤ 1.5×):")
print("- Q4_K neon-i8mm (smmla): %g with 2 rows, %g with 16 rows: %.2f× / %.2f× one column (%g)"
      % (i2, i16, i2 / one, i16 / one, one))
print("- Q6_K neon-i8mm (smmla): %g with 2 rows, %g with 16 rows: %.2f× / %.2f× one column (%g)"
      % (q2, q16, q2 / q6one, q16 / q6one, q6one))
print("- Q4_K neon-dotprod (1 row × 4 tokens): %g: %.2f× one column (%g; executed, same "
      "method: %g)" % (tile, tile / one, one, one_dyn))
' "$dyn_tile" "$one_q4k" "$dyn_one" "$i8_2" "$i8_16" "$one_q6k" "$q6_2" "$q6_16"
echo
echo "Toolchain: $(aarch64-linux-gnu-gcc --version | head -1); $(rustc --version); $(aarch64-linux-gnu-objdump --version | head -1); llama.cpp from llama-cpp-python $version ($(date -u +%F))"
