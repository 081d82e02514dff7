#!/usr/bin/env python3
"""Encoder benchmark (issue 19): one screenshot through our vision encoder and through
llama.cpp's, same projector GGUF, same image-token budget, same threads, alternated in one run
(ours, llama.cpp, ours, llama.cpp, ...). Not a test (minutes of CPU); run on an idle machine.

  bench/vision_encode.py [--model GGUF] [--mmproj GGUF[,GGUF...]] [--image PNG]
      [--max-tokens 256,1024] [--rounds 3] [--threads 2] [--bin DIR] [--llama-bin DIR]

Ours: `device-worker bench --encode-only --json -r 1 --image-max-tokens N` (a fresh process per
round; `encode_ms` = one timed encode after one untimed first encode, `first_ms` = that first
encode, which also pages in the weights). llama.cpp: `llama-mtmd-cli --image-max-tokens N`
(a fresh process per round), its log line "mtmd batch encoding done in N ms" (`mtmd_batch_encode`
of the one image: the encoder graph only, after preprocessing, as ours; older llama.cpp logs
"image slice encoded in N ms"). Both exclude decoding and resizing. The image-token counts
must agree (ours from its JSON, llama.cpp's from its first "find_slot: ... with N new tokens"
warning, the image's micro-batch: `-ub` is set to hold the whole image), else the run stops.

Defaults: the 0.8B-shape files of `tools/fixtures/make_qwen35_bench_model.sh --vision`
(text Q4_K_M, projectors F16 and Q8_0) and corpus trace_18/0.png (1080x2400).
Prints every raw number, then a table: mean ms per encode, ratio ours/llama.cpp (< 1 = faster).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache/tandem"))
MODELS = CACHE / "models"
PEER_BIN = CACHE / "peer/llama-cpp-python-0.3.36/vendor/llama.cpp/build/bin"
STEM = "qwen35vl-0.8b-shape-random"



class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default in --help."""

def ours(args, mmproj, max_tokens):
    """One `device-worker bench --encode-only` run; returns its JSON object."""
    cmd = [str(args.bin / "device-worker"), "bench", "--model", args.model, "--mmproj", mmproj, "--image", args.image,
           "--threads", str(args.threads), "--image-max-tokens", str(max_tokens), "--encode-only", "--json", "-r", "1"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {res.returncode}\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def peer(args, mmproj, max_tokens):
    """One `llama-mtmd-cli` run; returns (encode ms, image tokens)."""
    cmd = [str(args.llama_bin / "llama-mtmd-cli"), "-m", args.model, "--mmproj", mmproj, "--image", args.image,
           "-p", "x", "-n", "1", "--temp", "0", "-t", str(args.threads), "--image-max-tokens", str(max_tokens),
           "--chat-template", "chatml", "-c", str(max_tokens + 512),
           # one micro-batch for the whole image, so its find_slot warning gives the token count
           "-b", str(max(512, max_tokens)), "-ub", str(max(512, max_tokens))]
    res = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    log = res.stdout + res.stderr
    enc = re.findall(r"(?:image slice encoded|mtmd batch encoding done) in (\d+) ms", log)
    if res.returncode != 0 or len(enc) != 1:
        sys.exit(f"{' '.join(cmd)}: exit {res.returncode}, {len(enc)} 'encoded in' lines\n{log[-2000:]}")
    batch = re.search(r"find_slot: .* with (\d+) new tokens", log)
    if not batch:
        sys.exit(f"{' '.join(cmd)}: no image batch size in its log\n{log[-2000:]}")
    return float(enc[0]), int(batch.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--model", default=str(MODELS / f"{STEM}-Q4_K_M.gguf"))
    ap.add_argument("--mmproj", default=f"{MODELS}/mmproj-{STEM}-f16.gguf,{MODELS}/mmproj-{STEM}-q8_0.gguf")
    ap.add_argument("--image", default=os.path.join(os.environ.get("TANDEM_CORPUS", str(ROOT.parent / "shared/corpus/raw")),
                                                    "llamatouch_evaluator/trace_18/0.png"))
    ap.add_argument("--max-tokens", default="256,1024", help="--image-max-tokens values, comma-separated")
    ap.add_argument("--rounds", type=int, default=3, help="ours/llama.cpp pairs per setting")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bin", type=Path, default=ROOT / "target/release", help="folder with our device-worker")
    ap.add_argument("--llama-bin", type=Path, default=PEER_BIN, help="folder with llama-mtmd-cli")
    args = ap.parse_args()
    for f in [args.model, args.image, *args.mmproj.split(","), args.bin / "device-worker", args.llama_bin / "llama-mtmd-cli"]:
        if not Path(f).exists():
            sys.exit(f"missing {f} (tools/fixtures/make_qwen35_bench_model.sh --vision; cargo build --release; "
                     "tools/peer/build_llama_cpp.sh)")
    print(f"image {args.image}, model {args.model}, {args.threads} threads, {args.rounds} rounds; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    table = []
    for mmproj in args.mmproj.split(","):
        for max_tokens in (int(n) for n in args.max_tokens.split(",")):
            a, b, first = [], [], []
            for r in range(args.rounds):
                o = ours(args, mmproj, max_tokens)
                p_ms, p_tokens = peer(args, mmproj, max_tokens)
                if p_tokens != o["n_tokens"]:
                    sys.exit(f"image tokens differ: ours {o['n_tokens']}, llama.cpp {p_tokens}")
                a.append(o["encode_ms"])
                first.append(o["first_ms"])
                b.append(p_ms)
                print(f"  {Path(mmproj).name} max {max_tokens} round {r}: {o['n_tokens']} tokens "
                      f"({o['size'][0]}x{o['size'][1]}), ours {o['encode_ms']:.0f} ms (first {o['first_ms']:.0f}), "
                      f"llama.cpp {p_ms:.0f} ms; load {os.getloadavg()[0]:.2f}", flush=True)
            table.append((Path(mmproj).name, max_tokens, o["n_tokens"], a, first, b))
    print(f"\nload after the run {os.getloadavg()[0]:.2f}\n")
    print("| projector | --image-max-tokens | tokens | ours ms (mean) | ours first ms | llama.cpp ms (mean) | ours/llama.cpp |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, max_tokens, n, a, first, b in table:
        print(f"| {name} | {max_tokens} | {n} | {statistics.mean(a):.0f} | {statistics.mean(first):.0f} | "
              f"{statistics.mean(b):.0f} | {statistics.mean(a) / statistics.mean(b):.2f} |")


if __name__ == "__main__":
    main()
