#!/usr/bin/env python3
"""Generate greedy-decoding parity fixtures from the llama.cpp peer (llama-server).

Each prompt file ``<prompts>/<name>.txt`` holds one fully rendered raw prompt (chat special
tokens such as ``<|im_start|>`` included, no template applied by the server). For each one
this script asks a loopback ``llama-server`` for

* the prompt token ids: ``POST /tokenize`` with ``parse_special: true`` and ``add_special``
  equal to the model's own add-BOS setting (probed from the server, see ``probe_add_bos``);
* the greedy continuation: ``POST /completion`` with the prompt given as that token-id array
  (so the server adds nothing) and a sampler chain reduced to ``top_k`` with ``top_k = 1``
  (see ``GREEDY_FIELDS``), ``cache_prompt: false`` so no KV cache is reused between prompts,
  ``return_tokens: true`` and ``n_probs: 2`` (top-2 log-probabilities of the *raw* logits per
  step, so a consumer can tell a real mismatch from a near-tie),

and writes ``<out>/<name>.json``::

    {"model_file": "...gguf", "model_sha256": "...", "llama_cpp": "llama-cpp-python==0.3.36 vendor/llama.cpp",
     "server_args": [...], "request": {...}, "prompt": "...", "add_bos": bool,
     "prompt_tokens": [...], "n_predict": N, "output_tokens": [...], "output_text": "...",
     "stop_type": "eos" | "limit" | ..., "top2_logprobs": [[[id, logprob], [id, logprob]], ...]}

Regenerating fixtures (not part of CI; needs the peer built, ~15 min the first time)::

    tools/peer/parity_fixtures.sh                 # default paths, builds llama.cpp if needed
    # or directly:
    python3 tools/peer/parity_fixtures.py --model MODEL.gguf \\
        --prompts device-worker/tests/fixtures/parity/prompts --out device-worker/tests/fixtures/parity

Server flags: ``-t 2 -c 4096 -np 1 --temp 0 --host 127.0.0.1 --port P`` (see ``server_args``).
Python 3.11 standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import child_procs  # noqa: E402  (tools/child_procs.py)

LLAMA_CPP_ID = "llama-cpp-python==0.3.36 vendor/llama.cpp"
DEFAULT_CACHE = Path(os.environ.get("TANDEM_CACHE", str(Path.home() / ".cache" / "tandem")))
DEFAULT_SERVER = (
    DEFAULT_CACHE / "peer" / "llama-cpp-python-0.3.36" / "vendor" / "llama.cpp" / "build" / "bin" / "llama-server"
)

# Request fields that make /completion pure greedy in this llama.cpp version.
# The server builds its chain as [logit_bias?] + `samplers` + `dist`; with only top_k(1)
# the candidate list has one entry and `dist` must pick it (common/sampling.cpp,
# src/llama-sampler.cpp). The penalty/DRY/XTC fields are set to their "off" values too so
# the request stays greedy even if a later server version adds samplers by default.
GREEDY_FIELDS = {
    "samplers": ["top_k"],
    "top_k": 1,
    "temperature": 0.0,
    "top_p": 1.0,
    "min_p": 0.0,
    "typical_p": 1.0,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "dry_multiplier": 0.0,
    "xtc_probability": 0.0,
    "mirostat": 0,
    "seed": 0,
}


class PeerError(RuntimeError):
    """The peer server failed to start or answered unexpectedly."""


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, body: dict | None = None, timeout: float = 600.0) -> dict:
    """GET (body None) or POST a JSON body; returns the decoded JSON answer."""
    data = None if body is None else json.dumps(body).encode("utf-8")
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as e:
        detail = e.read().decode("utf-8", "replace")
        raise PeerError(f"{url}: HTTP {e.code}: {detail}") from e


def wait_healthy(base: str, proc: subprocess.Popen, timeout_s: float) -> None:
    """Polls GET /health until status ok, the process dies, or timeout_s passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PeerError(f"llama-server exited early with code {proc.returncode}")
        try:
            if http_json(base + "/health", timeout=5).get("status") == "ok":
                return
        except (urllib.error.URLError, ConnectionError, PeerError, TimeoutError):
            pass
        time.sleep(0.5)
    raise PeerError(f"llama-server not healthy after {timeout_s} s")


def tokenize(base: str, text: str, add_special: bool) -> list[int]:
    """POST /tokenize with special tokens parsed; returns token ids."""
    ans = http_json(base + "/tokenize", {"content": text, "add_special": add_special, "parse_special": True})
    return [int(t) for t in ans["tokens"]]


def probe_add_bos(base: str) -> bool:
    """True when the model's vocabulary adds BOS (llama_vocab_get_add_bos).

    /tokenize with add_special=true adds BOS exactly when the model asks for it, so the
    length difference against add_special=false tells us.
    """
    return len(tokenize(base, "a", True)) > len(tokenize(base, "a", False))


def complete_greedy(base: str, prompt_tokens: list[int], n_predict: int, ignore_eos: bool) -> tuple[dict, dict]:
    """POST /completion greedily; returns (request body, response JSON)."""
    body = {
        "prompt": prompt_tokens,
        "n_predict": n_predict,
        "cache_prompt": False,
        "return_tokens": True,
        "stream": False,
        "n_probs": 2,
        "post_sampling_probs": False,
        "ignore_eos": ignore_eos,
        **GREEDY_FIELDS,
    }
    return body, http_json(base + "/completion", body)


def top2_from(ans: dict) -> list[list[list[float]]]:
    """Per generated token, the top-2 [id, logprob] pairs of the raw logits."""
    out = []
    for step in ans.get("completion_probabilities", []):
        out.append([[int(c["id"]), float(c["logprob"])] for c in step.get("top_logprobs", [])])
    return out


def dump_fixture(fixture: dict) -> str:
    """JSON text with one top-level key per line and each value on one line (diff-friendly)."""
    lines = [f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in fixture.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def run(args: argparse.Namespace) -> int:
    model = Path(args.model).resolve()
    prompts_dir = Path(args.prompts)
    out_dir = Path(args.out)
    server = Path(args.server)
    if not model.is_file():
        raise PeerError(f"model file not found: {model}")
    if not server.is_file():
        raise PeerError(f"llama-server not found: {server} (run tools/peer/build_llama_cpp.sh)")
    prompt_files = sorted(prompts_dir.glob("*.txt"))
    if not prompt_files:
        raise PeerError(f"no *.txt prompts in {prompts_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)

    model_sha = sha256_file(model)
    port = args.port or free_port()
    base = f"http://127.0.0.1:{port}"
    # Recorded in each fixture; host/port are appended separately since they vary per run.
    server_args = ["-t", str(args.threads), "-c", str(args.ctx), "-np", "1", "--temp", "0"]
    cmd = [str(server), "-m", str(model), *server_args, "--host", "127.0.0.1", "--port", str(port)]
    log_path = out_dir / ".llama-server.log" if args.keep_log else None
    log_f = open(log_path, "w") if log_path else subprocess.DEVNULL
    print(f"[parity] starting {' '.join(cmd)}", flush=True)
    proc = subprocess.Popen(cmd, stdout=log_f, stderr=subprocess.STDOUT)
    try:
        wait_healthy(base, proc, args.startup_timeout)
        add_bos = probe_add_bos(base)
        print(f"[parity] server up on {base}; model add_bos={add_bos}", flush=True)
        for pf in prompt_files:
            text = pf.read_text(encoding="utf-8")
            prompt_tokens = tokenize(base, text, add_bos)
            t0 = time.monotonic()
            body, ans = complete_greedy(base, prompt_tokens, args.n_predict, args.ignore_eos)
            dt = time.monotonic() - t0
            evaluated = ans.get("tokens_evaluated")
            if evaluated is not None and int(evaluated) != len(prompt_tokens):
                raise PeerError(f"{pf.name}: server evaluated {evaluated} prompt tokens, sent {len(prompt_tokens)}")
            output_tokens = [int(t) for t in ans.get("tokens", [])]
            fixture = {
                "model_file": model.name,
                "model_sha256": model_sha,
                "llama_cpp": LLAMA_CPP_ID,
                "server_args": server_args,
                "request": {k: v for k, v in body.items() if k != "prompt"},
                "prompt": text,
                "add_bos": add_bos,
                "prompt_tokens": prompt_tokens,
                "n_predict": args.n_predict,
                "output_tokens": output_tokens,
                "output_text": ans.get("content", ""),
                "stop_type": ans.get("stop_type"),
                "top2_logprobs": top2_from(ans),
            }
            dest = out_dir / (pf.stem + ".json")
            dest.write_text(dump_fixture(fixture), encoding="utf-8")
            print(f"[parity] {pf.name}: {len(prompt_tokens)} prompt tok -> {len(output_tokens)} out tok "
                  f"({ans.get('stop_type')}, {dt:.1f} s) -> {dest}", flush=True)
    finally:
        child_procs.stop(proc, timeout=15)
        if log_path:
            log_f.close()
    return 0


def run_main(tag: str, doc: str, add_arguments, run, argv: list[str] | None = None) -> int:
    """The peer scripts' entry point: an argparse parser described by the first paragraph of
    `doc`, options from `add_arguments(parser)`, then `run(args)`; a `PeerError` becomes
    `[tag] error: ...` on stderr and exit status 1."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except PeerError as e:
        print(f"[{tag}] error: {e}", file=sys.stderr)
        return 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="GGUF model file")
    p.add_argument("--prompts", required=True, help="folder of *.txt fully rendered prompts")
    p.add_argument("--out", required=True, help="folder for <name>.json fixtures")
    p.add_argument("--n-predict", type=int, default=48)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--server", default=str(DEFAULT_SERVER), help="llama-server binary")
    p.add_argument("--port", type=int, default=0, help="0 = pick a free port")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-generation tokens")
    p.add_argument("--startup-timeout", type=float, default=120.0)
    p.add_argument("--keep-log", action="store_true", help="write the server log to <out>/.llama-server.log")


if __name__ == "__main__":
    sys.exit(run_main("parity", __doc__, add_arguments, run))
