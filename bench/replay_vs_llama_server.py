#!/usr/bin/env python3
"""Real-replay benchmark for cross-request reuse (issue 4): corpus steps through our worker
under each checkpoint policy and through llama.cpp's llama-server, in one run, same model,
same threads, both prompt formats. Reports mean server time per step and new prompt tokens per
step. Not a test (minutes of CPU); run on an idle machine.

  bench/replay_vs_llama_server.py [--model GGUF] [--steps 40] [--threads 2] [--max-tokens 14]
      [--formats system-user,single-user] [--configs divergence+cons,divergence,stock,marconi]
      [--baseline-bin DIR] [--episodes E1,E2] [--rounds 1]
      [--screenshots --mmproj GGUF --image-max-tokens N]

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

--episodes limits the plan to those episodes (default: all; with it --steps defaults to all
their steps). --rounds N runs llama-server and then every config N times in turn (A B A B), for
a machine whose load drifts; the table reports each round and the means over rounds.

--screenshots (issue 19): each step's user message also carries the step's corpus screenshot
(`N.png` beside the step's XML, the LlamaTouch traces) as an OpenAI `image_url` part with a
`data:image/png;base64,` URI, after the text (as the gateway's agent path places it); both
servers get the projector `--mmproj` and the same `--image-max-tokens`. Default episodes then
llamatouch/trace_18 and llamatouch/trace_7 (17 steps, 1080-wide screenshots), the projector
mmproj-qwen35vl-0.8b-shape-random-f16.gguf beside --model, and the model
qwen35vl-0.8b-shape-random-Q4_K_M.gguf (tools/fixtures/make_qwen35_bench_model.sh --vision).
The table adds image tokens and encoder ms per step (ours: the `tandem` block's image_tokens
and encoder_ms; llama-server reports neither separately).
"""
import argparse
import base64
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



class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default in --help."""

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


def steps(gateway_bin, corpus, n, only=None, screenshots=False):
    """The plan: (episode label, step, messages, screenshot PNG path or None) for n steps
    (None: every step of the chosen episodes once), episodes of `only` (ids, in that order;
    None: all, corpus order)."""
    out = subprocess.run([gateway_bin, "replay", "--list", "--corpus", corpus], capture_output=True, text=True, check=True).stdout
    listed = {l.split()[0]: (int(l.split()[1]), l.split()[3])
              for l in out.splitlines() if l.strip() and not l.startswith(" ") and "steps" in l}
    missing = [e for e in (only or []) if e not in listed]
    if missing:
        sys.exit(f"unknown episode(s) {missing}; `agent-gateway replay --list` has {sorted(listed)}")
    episodes = [(e, *listed[e]) for e in (only or listed)]
    if n is None:
        n = sum(count for _, count, _ in episodes)
    result, k = [], 0
    while len(result) < n:
        ep, count, source = episodes[k % len(episodes)]
        for i in range(count):
            if len(result) == n:
                break
            msgs = json.loads(subprocess.run([gateway_bin, "prompt", "--episode", ep, "--step", str(i), "--corpus", corpus],
                                             capture_output=True, text=True, check=True).stdout)["messages"]
            png = Path(corpus) / source / f"{i}.png"
            if screenshots and not png.is_file():
                sys.exit(f"--screenshots: {ep} step {i} has no screenshot {png}")
            result.append((f"{ep}#{k // len(episodes)}", i, msgs, png if screenshots else None))
        k += 1
    return result


def as_format(msgs, fmt, png=None):
    """The request's messages in format `fmt`; with `png`, the last (user) message's content is
    [its text, the screenshot as an image_url data: URI part]."""
    if fmt == "single-user":
        msgs = [{"role": "user", "content": msgs[0]["content"] + "\n\n" + msgs[1]["content"]}]
    if png is not None:
        uri = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
        msgs = msgs[:-1] + [{"role": "user", "content": [{"type": "text", "text": msgs[-1]["content"]},
                                                         {"type": "image_url", "image_url": {"url": uri}}]}]
    return msgs


def vision_args(args):
    """--mmproj and --image-max-tokens for both servers (none without --screenshots)."""
    return ["--mmproj", args.mmproj, "--image-max-tokens", str(args.image_max_tokens)] if args.screenshots else []


def run_ours(args, cfg, fmt, plan, log, bin_dir, label):
    wport, gport, hport = free_port(), free_port(), free_port()
    worker = subprocess.Popen([str(bin_dir / "device-worker"), "serve", "--listen", f"127.0.0.1:{wport}", "--model", args.model,
                               "--threads", str(args.threads), "--slots", "1", "--idle-release-ms", "600000", *CONFIGS[cfg],
                               *vision_args(args)],
                              stdout=log, stderr=log)
    gateway = subprocess.Popen([str(bin_dir / "agent-gateway"), "serve", "--listen", f"127.0.0.1:{gport}", "--worker",
                                f"http://127.0.0.1:{wport}", "--http-listen", f"127.0.0.1:{hport}"], stdout=log, stderr=log)
    try:
        # The worker answers Status while loading; wait for its gRPC health to say SERVING.
        subprocess.run([str(bin_dir / "agent-gateway"), "health", "--addr", f"http://127.0.0.1:{wport}", "--wait", "300"],
                       stdout=log, stderr=log, check=True)
        wait_http(f"http://127.0.0.1:{hport}/health", gateway, "agent-gateway")
        rows = []
        for ep, i, msgs, png in plan:
            r = post(f"http://127.0.0.1:{hport}/v1/chat/completions",
                     {"messages": as_format(msgs, fmt, png), "max_tokens": args.max_tokens, "temperature": 0},
                     {"X-Episode-Id": ep})
            t = r["tandem"]
            rows.append((t["server_ms"], t["new_tokens"], t["kv_bound_tokens"], r["usage"]["prompt_tokens"],
                         t.get("image_tokens", 0), t.get("encoder_ms", 0.0)))
            img = f", {t.get('image_tokens', 0)} image, encoder {t.get('encoder_ms', 0.0):.0f} ms" if png else ""
            print(f"  ours {label:<26} {fmt:<12} {ep:<50} {i:>2}: {t['new_tokens']:>5} new, {t['server_ms']:>8.0f} ms"
                  f"{img}", flush=True)
        return rows
    finally:
        for p in (gateway, worker):
            p.terminate()
            p.wait()


def run_peer(args, fmt, plan, log):
    port = free_port()
    srv = subprocess.Popen([str(args.llama_server), "-m", args.model, "-t", str(args.threads), "-np", "1", "-c", "8192",
                            "--port", str(port), "--host", "127.0.0.1", "--ctx-checkpoints", "8", *vision_args(args)],
                           stdout=log, stderr=log)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", srv, "llama-server")
        rows = []
        for ep, i, msgs, png in plan:
            r = post(f"http://127.0.0.1:{port}/v1/chat/completions",
                     {"messages": as_format(msgs, fmt, png), "max_tokens": args.max_tokens, "temperature": 0, "cache_prompt": True})
            t = r["timings"]
            rows.append((t["prompt_ms"] + t["predicted_ms"], t["prompt_n"], None, r["usage"]["prompt_tokens"], None, None))
            print(f"  llama-server     {fmt:<12} {ep:<50} {i:>2}: {t['prompt_n']:>5} new, {rows[-1][0]:>8.0f} ms", flush=True)
        return rows
    finally:
        srv.terminate()
        srv.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--model", help="default: models/qwen35-0.8b-shape-random-Q4_K_M.gguf "
                    "(qwen35vl-… with --screenshots)")
    ap.add_argument("--steps", type=int, help="default 40; with --episodes or --screenshots, all their steps")
    ap.add_argument("--episodes", help="comma-separated episode ids (default: all; llamatouch/trace_18,llamatouch/trace_7 "
                    "with --screenshots)")
    ap.add_argument("--rounds", type=int, default=1, help="run llama-server and the configs this many times in turn")
    ap.add_argument("--screenshots", action="store_true", help="send each step's corpus screenshot (see above)")
    ap.add_argument("--mmproj", help="projector GGUF for both servers (default: mmproj-qwen35vl-0.8b-shape-random-f16.gguf)")
    ap.add_argument("--image-max-tokens", type=int, default=1024)
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
    models = CACHE / "models"
    stem = "qwen35vl-0.8b-shape-random" if args.screenshots else "qwen35-0.8b-shape-random"
    args.model = args.model or str(models / f"{stem}-Q4_K_M.gguf")
    if args.screenshots:
        args.mmproj = args.mmproj or str(models / f"mmproj-{stem}-f16.gguf")
        args.episodes = args.episodes or "llamatouch/trace_18,llamatouch/trace_7"
    elif args.mmproj:
        sys.exit("--mmproj needs --screenshots")
    if args.steps is None and not args.episodes:
        args.steps = 40
    for f in [args.model] + ([args.mmproj] if args.screenshots else []):
        if not Path(f).is_file():
            sys.exit(f"missing {f} (tools/fixtures/make_qwen35_bench_model.sh{' --vision' if args.screenshots else ''})")
    bins = [args.bin] + ([args.baseline_bin] if args.baseline_bin else [])
    for b in [d / exe for d in bins for exe in ("device-worker", "agent-gateway")] + [args.llama_server]:
        if not Path(b).exists():
            sys.exit(f"missing {b} (cargo build --release; tools/peer/build_llama_cpp.sh)")
    Path(args.log).parent.mkdir(parents=True, exist_ok=True)
    plan = steps(str(args.bin / "agent-gateway"), args.corpus, args.steps,
                 args.episodes.split(",") if args.episodes else None, args.screenshots)
    print(f"{len(plan)} steps, model {args.model}, {args.threads} threads, max_tokens {args.max_tokens}; load {os.getloadavg()[0]:.2f}")
    if args.screenshots:
        print(f"screenshots: projector {args.mmproj}, --image-max-tokens {args.image_max_tokens}")
    print(f"ours: {args.bin}" + (f"; baseline: {args.baseline_bin}" if args.baseline_bin else ""))
    table = []
    with open(args.log, "w") as log:
        for rnd in range(args.rounds):
            for fmt in args.formats.split(","):
                print(f"round {rnd}, {fmt}; load {os.getloadavg()[0]:.2f}", flush=True)
                peer = run_peer(args, fmt, plan, log)
                table.append((rnd, fmt, "llama-server", peer))
                for cfg in args.configs.split(","):
                    table.append((rnd, fmt, cfg, run_ours(args, cfg, fmt, plan, log, args.bin, cfg)))
                    if args.baseline_bin:
                        label = f"{cfg} @baseline"
                        table.append((rnd, fmt, label, run_ours(args, cfg, fmt, plan, log, args.baseline_bin, label)))
    print(f"\nload after the run {os.getloadavg()[0]:.2f}\n")
    print("| round | format | server | mean server ms/step | × llama-server | new tokens/step | KV bound new/step "
          "| image tokens/step | encoder ms/step |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    rounds = [str(r) for r in range(args.rounds)] + (["mean"] if args.rounds > 1 else [])
    for rnd in rounds:
        for fmt in args.formats.split(","):
            picked = [(name, r) for n, f, name, r in table if f == fmt and (rnd == "mean" or str(n) == rnd)]
            names = list(dict.fromkeys(name for name, _ in picked))
            # per server: all rows of the chosen round(s), concatenated
            merged = {name: [x for nm, r in picked if nm == name for x in r] for name in names}
            peer_ms = sum(x[0] for x in merged["llama-server"]) / len(merged["llama-server"])
            for name in names:
                r = merged[name]
                ms = sum(x[0] for x in r) / len(r)
                new = sum(x[1] for x in r) / len(r)
                kv = [x[3] - x[2] for x in r if x[2] is not None]
                kvs = f"{sum(kv) / len(kv):.1f}" if kv else ""
                img = [x for x in r if x[4] is not None]
                imgs = (f"{sum(x[4] for x in img) / len(img):.0f} | {sum(x[5] for x in img) / len(img):.0f}"
                        if img else " | ")
                print(f"| {rnd} | {fmt} | {name} | {ms:.0f} | {ms / peer_ms:.2f} | {new:.1f} | {kvs} | {imgs} |")

if __name__ == "__main__":
    main()
