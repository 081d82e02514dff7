#!/usr/bin/env python3
"""Replay benchmark for speculative decoding (issue 5): corpus episodes through gateway and
worker (release build, the default model unless --model), once per drafter configuration, in
one run. Reports decode ms per output token, target passes per output token, and drafts
accepted / proposed. Experience-memory configurations replay the corpus twice on the same
worker and report the second pass (memory warm), as PastForward measures repeated tasks.
Not a test (minutes of CPU); run on an idle machine.

  bench/spec_replay.py [--model GGUF] [--count 4] [--max-steps 0] [--threads 2]
      [--configs none,prompt-lookup,experience,both]

Output: a Markdown table on stdout; the per-step JSONL of every run under --out (default
target/spec-replay/).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache/tandem"))
# name: (worker flags, passes over the corpus; the last one is reported)
CONFIGS = {
    "none": (["--drafters", "none"], 1),
    "prompt-lookup": (["--drafters", "prompt-lookup"], 1),
    "experience": (["--drafters", "experience"], 2),
    "both": (["--drafters", "experience,prompt-lookup"], 2),
}



class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default in --help."""

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--model", default=str(CACHE / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--corpus", default=str(ROOT.parent / "shared/corpus/raw"))
    ap.add_argument("--count", type=int, default=4, help="episodes (corpus order)")
    ap.add_argument("--max-steps", type=int, default=0, help="steps per episode (0: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", default=str(ROOT / "target/spec-replay"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cargo", "build", "--release", "-p", "device-worker", "-p", "agent-gateway"], cwd=ROOT, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    worker_bin, gw_bin = target / "release/device-worker", target / "release/agent-gateway"
    rows = []
    for name in a.configs.split(","):
        flags, passes = CONFIGS[name]
        wport, gport = free_port(), free_port()
        log = open(out / f"{name}.worker.log", "w")
        procs = [subprocess.Popen([str(worker_bin), "serve", "--listen", f"127.0.0.1:{wport}", "--model", a.model,
                                   "--threads", str(a.threads), "--slots", "1", "--power-backend", "none", *flags],
                                  stdout=log, stderr=log)]
        procs.append(subprocess.Popen([str(gw_bin), "serve", "--listen", f"127.0.0.1:{gport}", "--worker",
                                       f"http://127.0.0.1:{wport}", "--http-listen", "off"], stdout=log, stderr=log))
        try:
            subprocess.run([str(gw_bin), "health", "--addr", f"127.0.0.1:{wport}", "--service",
                            "tandem.step.v1.StepService", "--wait", "180"], check=True, stdout=subprocess.DEVNULL)
            subprocess.run([str(gw_bin), "health", "--addr", f"127.0.0.1:{gport}", "--wait", "30"], check=True,
                           stdout=subprocess.DEVNULL)
            for p in range(passes):
                jsonl = out / f"{name}.pass{p}.jsonl"
                t0 = time.time()
                subprocess.run([str(gw_bin), "replay", "--gateway", f"http://127.0.0.1:{gport}", "--corpus", a.corpus,
                                "--count", str(a.count), "--max-steps", str(a.max_steps), "--out", str(jsonl)],
                               check=True, stdout=subprocess.DEVNULL)
                print(f"{name} pass {p}: {time.time() - t0:.0f} s", file=sys.stderr)
        finally:
            for pr in procs:
                pr.terminate()
            for pr in procs:
                pr.wait()
        recs = [json.loads(l) for l in open(jsonl)]
        tokens = sum(r["decode_tokens"] for r in recs)
        passes_n = sum(r["decode_passes"] for r in recs)
        dms = sum(r["decode_ms"] for r in recs)
        prop = sum(d["proposed"] for r in recs for d in r["drafts"])
        acc = sum(d["accepted"] for r in recs for d in r["drafts"])
        outputs = [r["raw_output"] for r in recs]
        rows.append((name, len(recs), tokens, dms / max(tokens, 1), passes_n / max(tokens, 1), acc, prop, outputs))
    base = rows[0]
    print(f"\nmodel {a.model}, {a.threads} threads, {a.count} episode(s); experience rows = second pass (memory warm)\n")
    print("| drafters | steps | output tokens | decode ms/token | vs none | target passes/token | drafts accepted/proposed | same outputs as first row |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, steps, tokens, mspt, ppt, acc, prop, outputs in rows:
        same = "yes" if outputs == base[7] else "NO"
        print(f"| {name} | {steps} | {tokens} | {mspt:.2f} | {mspt / base[3]:.2f}x | {ppt:.2f} | {acc}/{prop} | {same} |")


if __name__ == "__main__":
    main()
