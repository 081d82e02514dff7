#!/usr/bin/env bash
# The aarch64 worker, run under qemu-user, decodes the same greedy tokens as the x86_64
# worker: for each model, an x86_64 worker (--kernels avx2: the numerics the NEON backends
# reproduce; the AVX-512 K-quant kernels round differently) and the static aarch64 worker at
# each QEMU_CPU level serve on local ports, the x86_64 `device-worker request` sends the same
# prompts to both (greedy, MAX_TOKENS tokens, default 32) and their output token ids must be equal.
# Usage: tools/aarch64/worker_test.sh AARCH64_WORKER X86_64_WORKER [MODEL.gguf...]
#   (default models: the tiny qwen35 fixtures F32, Q8_0, F16, the wide Q4_K_M one and the
#   default SmolLM2 model)
#   AARCH64_WORKER_CPUS="max cortex-a53" (QEMU_CPU levels; each runs its best backend, named
#   with --kernels: neon-i8mm on max, neon-dotprod on cortex-a76, neon on cortex-a53)
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/aarch64/env.sh
arm=${1:?usage: $0 AARCH64_WORKER X86_64_WORKER [MODEL...]}
x86=${2:?usage: $0 AARCH64_WORKER X86_64_WORKER [MODEL...]}
shift 2
if (( $# )); then
  models=("$@")
else
  fx=device-worker/tests/fixtures/qwen35
  models=("$fx/tiny-qwen35-f32.gguf" "$fx/tiny-qwen35-q8_0.gguf" "$fx/tiny-qwen35-f16.gguf"
    "$fx/wide-qwen35-q4_k_m.gguf" "$(tools/fetch_model.sh)")
fi
cpus=(${AARCH64_WORKER_CPUS:-max cortex-a53})
prompts=("The capital of France is" "Once upon a time, a small robot" "def fibonacci(n):")
logs=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# serve PORT LOG MODEL KERNELS CMD...: starts a worker in the background, waits until it serves.
serve() {
  local port=$1 log=$2 model=$3 kernels=$4
  shift 4
  "$@" serve --kernels "$kernels" --listen "127.0.0.1:$port" --model "$model" --threads 2 \
    --slots 1 --ctx-size 512 >"$log" 2>&1 &
  pids+=($!)
  local pid=$! t0=$SECONDS
  # Up when the port accepts and the model is loaded (requests before that are refused).
  until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && grep -q "model loaded" "$log"; do
    kill -0 "$pid" 2>/dev/null || { echo "worker on $port exited:" >&2; cat "$log" >&2; exit 1; }
    (( SECONDS - t0 < 600 )) || { echo "worker on $port not up after 600 s" >&2; exit 1; }
    sleep 1
  done
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# tokens PORT PROMPT: the output token ids as one line.
tokens() {
  "$x86" request --addr "http://127.0.0.1:$1" --text "$2" --max-tokens "${MAX_TOKENS:-32}" |
    python3 -c 'import json,sys; d=json.loads(sys.stdin.readline()); print(" ".join(map(str, d["tokens"])), "|", json.dumps(d["text"]))'
}

fail=0
for model in "${models[@]}"; do
  serve 50171 "$logs/x86.log" "$model" avx2 "$x86"
  x86_pid=${pids[-1]}
  declare -A want=()
  for p in "${prompts[@]}"; do want[$p]=$(tokens 50171 "$p"); done
  stop "$x86_pid"
  for cpu in "${cpus[@]}"; do
    t0=$SECONDS
    case $cpu in
      max) k=neon-i8mm ;;
      cortex-a7[6-9]* | neoverse*) k=neon-dotprod ;;
      *) k=neon ;;
    esac
    QEMU_CPU=$cpu serve 50172 "$logs/arm.log" "$model" "$k" qemu-aarch64 "$arm"
    arm_pid=${pids[-1]}
    grep -q "model loaded.* kernels=\"$k\"" "$logs/arm.log" || { echo "the worker runs no $k:" >&2; cat "$logs/arm.log" >&2; exit 1; }
    kernels=$k
    for p in "${prompts[@]}"; do
      got=$(tokens 50172 "$p")
      if [[ "$got" == "${want[$p]}" ]]; then
        echo "same   $(basename "$model") QEMU_CPU=$cpu ${kernels:+($kernels) }\"$p\" -> $got"
      else
        echo "DIFFER $(basename "$model") QEMU_CPU=$cpu \"$p\": aarch64 $got / x86_64 ${want[$p]}"
        fail=1
      fi
    done
    stop "$arm_pid"
    echo "       ($((SECONDS - t0)) s under qemu)"
  done
  unset want
done
(( fail == 0 )) && echo "aarch64 worker: greedy tokens equal the x86_64 worker's on ${#models[@]} models"
exit $fail
