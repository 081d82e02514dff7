#!/usr/bin/env python3
"""Real-replay benchmark for cross-request reuse (issue 4): corpus steps through our worker
under each checkpoint policy and through llama.cpp's llama-server, in one run, same model,
same threads, both prompt formats. Reports mean server time per step and new prompt tokens per
step. Not a test (minutes of CPU); run on an idle machine.

  bench/replay_vs_llama_server.py [--model GGUF] [--steps 40] [--threads 2] [--max-tokens 14]
      [--formats system-user,single-user] [--configs divergence+cons,divergence,stock,marconi]
      [--baseline-bin DIR]

With --baseline-bin (the release folder of an earlier commit's build), every config also runs
on that build's worker and gateway in the same run ("CONFIG @baseline" rows): before and after
a change, side by side with llama-server.

Prompts: `agent-gateway prompt --episode E --step I` (the gateway's own prompt builder, history
= recorded actions), episodes in corpus order, cycled until --steps steps (a second pass over an
episode is a warm revisit). Each step goes to /v1/chat/completions with greedy decoding and
max_tokens; one episode id per episode (X-Episode-Id for ours; llama-server runs -np 1, so every
request lands on its single slot, as in ../shared/PEER.md). Ours: device-worker (1 slot) behind
agent-gateway's OpenAI endpoint; server time = the worker's server_ms, new tokens = new_tokens.
llama-server (built by tools/peer/build_llama_cpp.sh, default checkpoint settings
--ctx-checkpoints 8): server time = timings.prompt_ms + timings.predicted_ms, new tokens =
timings.prompt_n.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import child_procs  # noqa: E402  (tools/child_procs.py)
CACHE = Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache/tandem"))
PEER_BIN = CACHE / "peer/llama-cpp-python-0.3.36/vendor/llama.cpp/build/bin/llama-server"
CONFIGS = {
    "divergence+cons": ["--cache-policy", "divergence", "--consolidate", "true"],
    "divergence": ["--cache-policy", "divergence", "--consolidate", "false"],
    "stock": ["--cache-policy", "stock", "--consolidate", "false"],
    "marconi": ["--cache-policy", "marconi", "--consolidate", "false"],
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, headers=None, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_http(url, proc, what, timeout=300):
    try:
        child_procs.wait_http_ok(url, proc, timeout, what, poll=0.5, request_timeout=2)
    except RuntimeError as e:
        sys.exit(f"{e}; see its log")


def steps(gateway_bin, corpus, n):
    out = subprocess.run([gateway_bin, "replay", "--list", "--corpus", corpus], capture_output=True, text=True, check=True).stdout
    episodes = [(l.split()[0], int(l.split()[1])) for l in out.splitlines() if l.strip() and not l.startswith(" ") and "steps" in l]
    result, k = [], 0
    while len(result) < n:
        ep, count = episodes[k % len(episodes)]
        for i in range(count):
            if len(result) == n:
                break
            msgs = json.loads(subprocess.run([gateway_bin, "prompt", "--episode", ep, "--step", str(i), "--corpus", corpus],
                                             capture_output=True, text=True, check=True).stdout)["messages"]
            result.append((f"{ep}#{k // len(episodes)}", i, msgs))
        k += 1
    return result


def as_format(msgs, fmt):
    if fmt == "single-user":
        return [{"role": "user", "content": msgs[0]["content"] + "\n\n" + msgs[1]["content"]}]
    return msgs


def run_ours(args, cfg, fmt, plan, log, bin_dir, label):
    wport, gport, hport = free_port(), free_port(), free_port()
    worker = subprocess.Popen([str(bin_dir / "device-worker"), "serve", "--listen", f"127.0.0.1:{wport}", "--model", args.model,
                               "--threads", str(args.threads), "--slots", "1", "--idle-release-ms", "600000", *CONFIGS[cfg]],
                              stdout=log, stderr=log)
    gateway = subprocess.Popen([str(bin_dir / "agent-gateway"), "serve", "--listen", f"127.0.0.1:{gport}", "--worker",
                                f"http://127.0.0.1:{wport}", "--http-listen", f"127.0.0.1:{hport}"], stdout=log, stderr=log)
    try:
        # The worker answers Status while loading; wait for its gRPC health to say SERVING.
        subprocess.run([str(bin_dir / "agent-gateway"), "health", "--addr", f"http://127.0.0.1:{wport}", "--wait", "300"],
                       stdout=log, stderr=log, check=True)
        wait_http(f"http://127.0.0.1:{hport}/health", gateway, "agent-gateway")
        rows = []
        for ep, i, msgs in plan:
            r = post(f"http://127.0.0.1:{hport}/v1/chat/completions",
                     {"model": "m", "messages": as_format(msgs, fmt), "max_tokens": args.max_tokens, "temperature": 0},
                     {"X-Episode-Id": ep})
            t = r["tandem"]
            rows.append((t["server_ms"], t["new_tokens"], t["kv_bound_tokens"], r["usage"]["prompt_tokens"]))
            print(f"  ours {label:<26} {fmt:<12} {ep:<50} {i:>2}: {t['new_tokens']:>5} new, {t['server_ms']:>8.0f} ms", flush=True)
        return rows
    finally:
        for p in (gateway, worker):
            p.terminate()
            p.wait()


def run_peer(args, fmt, plan, log):
    port = free_port()
    srv = subprocess.Popen([str(args.llama_server), "-m", args.model, "-t", str(args.threads), "-np", "1", "-c", "8192",
                            "--port", str(port), "--host", "127.0.0.1", "--ctx-checkpoints", "8"], stdout=log, stderr=log)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", srv, "llama-server")
        rows = []
        for ep, i, msgs in plan:
            r = post(f"http://127.0.0.1:{port}/v1/chat/completions",
                     {"messages": as_format(msgs, fmt), "max_tokens": args.max_tokens, "temperature": 0, "cache_prompt": True})
            t = r["timings"]
            rows.append((t["prompt_ms"] + t["predicted_ms"], t["prompt_n"], None, r["usage"]["prompt_tokens"]))
            print(f"  llama-server     {fmt:<12} {ep:<50} {i:>2}: {t['prompt_n']:>5} new, {rows[-1][0]:>8.0f} ms", flush=True)
        return rows
    finally:
        srv.terminate()
        srv.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(CACHE / "models/qwen35-0.8b-shape-random-Q4_K_M.gguf"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=14)
    ap.add_argument("--formats", default="single-user,system-user")
    ap.add_argument("--configs", default="divergence+cons,divergence,stock,marconi")
    ap.add_argument("--corpus", default=os.environ.get("TANDEM_CORPUS", str(ROOT.parent / "shared/corpus/raw")))
    ap.add_argument("--bin", type=Path, default=ROOT / "target/release")
    ap.add_argument("--llama-server", type=Path, default=PEER_BIN)
    ap.add_argument("--baseline-bin", type=Path, help="also run every config on this folder's device-worker and agent-gateway")
    ap.add_argument("--log", default="replay-out/replay_vs_llama_server.log")
    args = ap.parse_args()
    bins = [args.bin] + ([args.baseline_bin] if args.baseline_bin else [])
    for b in [d / exe for d in bins for exe in ("device-worker", "agent-gateway")] + [args.llama_server]:
        if not Path(b).exists():
            sys.exit(f"missing {b} (cargo build --release; tools/peer/build_llama_cpp.sh)")
    Path(args.log).parent.mkdir(parents=True, exist_ok=True)
    plan = steps(str(args.bin / "agent-gateway"), args.corpus, args.steps)
    print(f"{len(plan)} steps, model {args.model}, {args.threads} threads, max_tokens {args.max_tokens}; load {os.getloadavg()[0]:.2f}")
    print(f"ours: {args.bin}" + (f"; baseline: {args.baseline_bin}" if args.baseline_bin else ""))
    table = []
    with open(args.log, "w") as log:
        for fmt in args.formats.split(","):
            peer = run_peer(args, fmt, plan, log)
            table.append((fmt, "llama-server", peer))
            for cfg in args.configs.split(","):
                table.append((fmt, cfg, run_ours(args, cfg, fmt, plan, log, args.bin, cfg)))
                if args.baseline_bin:
                    label = f"{cfg} @baseline"
                    table.append((fmt, label, run_ours(args, cfg, fmt, plan, log, args.baseline_bin, label)))
    print(f"\nload after the run {os.getloadavg()[0]:.2f}\n")
    print("| format | server | mean server ms/step | × llama-server | new tokens/step | KV bound new/step |")
    print("|---|---|---:|---:|---:|---:|")
    for fmt in args.formats.split(","):
        rows = [(name, r) for f, name, r in table if f == fmt]
        peer_ms = sum(x[0] for x in rows[0][1]) / len(rows[0][1])
        for name, r in rows:
            ms = sum(x[0] for x in r) / len(r)
            new = sum(x[1] for x in r) / len(r)
            kv = [x[3] - x[2] for x in r if x[2] is not None]
            kvs = f"{sum(kv) / len(kv):.1f}" if kv else ""
            print(f"| {fmt} | {name} | {ms:.0f} | {ms / peer_ms:.2f} | {new:.1f} | {kvs} |")


if __name__ == "__main__":
    main()
