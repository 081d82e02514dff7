#!/usr/bin/env python3
"""llama.cpp references for the screenshot path (issue 19): image embeddings and greedy tokens.

For the tiny Qwen3.5-VL fixture (``device-worker/tests/fixtures/qwen35vl/``) this script asks
the llama.cpp peer, for each projector (``--mmproj``, default F32, F16 and Q8_0) and each
fixture image (a 270×600 screenshot that needs resizing, a 256×384 crop that does not):

* the image embeddings the projector produces: ``MTMD_DEBUG_EMBEDDINGS=FILE llama-mtmd-cli
  -m TEXT --mmproj MMPROJ --image IMG -p x -n 1 --temp 0 --chat-template chatml`` (``tools/mtmd/clip.cpp`` writes
  ``[i32 n_tokens][i32 n_embd][f32 n_tokens*n_embd]``, little-endian, row-major), stored as
  ``llama_cpp/emb-<mmproj>-<image>.bin`` in that same format;
* the greedy continuation of ``PROMPTS`` (ChatML rendered as the worker renders a chat whose
  user message is ``content`` + image + ``after``; the image stands as llama.cpp's media
  marker ``<__media__>`` (pinned with ``LLAMA_MEDIA_MARKER``; the server draws a random one
  otherwise), which mtmd wraps in ``<|vision_start|>``/``<|vision_end|>``): one
  loopback ``llama-server -m TEXT --mmproj MMPROJ -t 2 -c 4096 -np 1 --temp 0`` per projector,
  ``POST /completion`` with ``{"prompt_string", "multimodal_data": [base64]}``, pure greedy
  (``parity_fixtures.GREEDY_FIELDS``), ``cache_prompt: false``, ``return_tokens``,
  ``n_probs: 2``; stored as ``llama_cpp/greedy-<mmproj>.json``: per case the prompt parts, the
  image, ``tokens_evaluated`` (text + image tokens), ``output_tokens`` and the top-2 raw
  log-probabilities per step (so a consumer can tell a real mismatch from a near-tie).

Both use llama.cpp's default image token budget (``--image-min-tokens``/``--image-max-tokens``
unset), as the worker's defaults. Not part of CI; needs the peer built
(``tools/peer/build_llama_cpp.sh``, which builds ``llama-mtmd-cli`` and ``llama-server``)::

    python3 tools/peer/vision_parity_fixtures.py            # writes the files named above

Read by ``device-worker/tests/vision_parity.rs``. Python 3.11 standard library only.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import child_procs  # noqa: E402  (tools/child_procs.py)
from parity_fixtures import (  # noqa: E402  (tools/peer/parity_fixtures.py)
    DEFAULT_SERVER,
    GREEDY_FIELDS,
    LLAMA_CPP_ID,
    PeerError,
    dump_fixture,
    free_port,
    http_json,
    run_main,
    sha256_file,
    top2_from,
    wait_healthy,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "device-worker" / "tests" / "fixtures" / "qwen35vl"
TEXT_MODEL = "tiny-qwen35vl-f32.gguf"
PROJECTORS = ["mmproj-tiny-qwen35vl-f32.gguf", "mmproj-tiny-qwen35vl-f16.gguf", "mmproj-tiny-qwen35vl-q8_0.gguf"]
IMAGES = ["screenshot-270x600.png", "crop-256x384.png"]
MEDIA_MARKER = "<__media__>"
N_PREDICT = 12

# (name, system, user content before the image, user text after the image). The worker
# renders ChatML (the fixture has no template of its own) as
#   <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{before}{IMAGE}{after}<|im_end|>\n<|im_start|>assistant\n
PROMPTS = [
    (
        "tap",
        "You operate an Android phone. Reply with one JSON action.",
        "Task: open the settings.\nScreen:\n",
        "\nWhat is the next action?",
    ),
    (
        "describe",
        "You are a helpful assistant.",
        "",
        "Describe this screen.",
    ),
    (
        "history",
        "Rules: answer with {\"action\": ...} only.",
        "Task: turn on Wi-Fi.\nHistory:\n- tap(3)\n- scroll(down)\n",
        "\nNext?",
    ),
]


def chatml(system: str, before: str, image: str, after: str) -> str:
    """The worker's ChatML rendering of system + user(before, image, after) + generation prompt."""
    return (
        f"<|im_start|>system\n{system}<|im_end|>\n"
        f"<|im_start|>user\n{before}{image}{after}<|im_end|>\n<|im_start|>assistant\n"
    )


def stem(name: str) -> str:
    """`mmproj-tiny-qwen35vl-q8_0.gguf` -> `q8_0`, `crop-256x384.png` -> `crop-256x384`."""
    base = name.rsplit(".", 1)[0]
    return base.rsplit("-", 1)[1] if base.startswith("mmproj-") else base


def embeddings(cli: Path, text: Path, mmproj: Path, image: Path, dest: Path, threads: int) -> tuple[int, int]:
    """Runs llama-mtmd-cli with MTMD_DEBUG_EMBEDDINGS=dest; returns (n_tokens, n_embd) of the dump."""
    cmd = [str(cli), "-m", str(text), "--mmproj", str(mmproj), "--image", str(image),
           "-p", "x", "-n", "1", "--temp", "0", "-t", str(threads),
           # The fixture has no chat template; the prompt does not affect the embeddings.
           "--chat-template", "chatml"]
    env = dict(os.environ, MTMD_DEBUG_EMBEDDINGS=str(dest))
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, errors="replace", timeout=600)
    if res.returncode != 0 or not dest.is_file():
        raise PeerError(f"{' '.join(cmd)}: exit {res.returncode}, no {dest}\n{res.stderr[-2000:]}")
    raw = dest.read_bytes()
    n_tokens = int.from_bytes(raw[0:4], "little", signed=True)
    n_embd = int.from_bytes(raw[4:8], "little", signed=True)
    if len(raw) != 8 + 4 * n_tokens * n_embd:
        raise PeerError(f"{dest}: {len(raw)} bytes, header says {n_tokens}x{n_embd}")
    return n_tokens, n_embd


def greedy_cases(server: Path, text: Path, mmproj: Path, threads: int, startup_timeout: float) -> tuple[list, list]:
    """One llama-server with `mmproj`; every (prompt, image) case greedily. Returns (server_args, cases)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server_args = ["-t", str(threads), "-c", "4096", "-np", "1", "--temp", "0"]
    cmd = [str(server), "-m", str(text), "--mmproj", str(mmproj), *server_args,
           "--host", "127.0.0.1", "--port", str(port)]
    print(f"[vision-parity] starting {' '.join(cmd)}", flush=True)
    # The server draws a random media marker per start unless LLAMA_MEDIA_MARKER pins it.
    env = dict(os.environ, LLAMA_MEDIA_MARKER=MEDIA_MARKER)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    cases = []
    try:
        wait_healthy(base, proc, startup_timeout)
        for image in IMAGES:
            data = base64.b64encode((FIXTURES / image).read_bytes()).decode("ascii")
            for name, system, before, after in PROMPTS:
                body = {
                    "prompt": {"prompt_string": chatml(system, before, MEDIA_MARKER, after), "multimodal_data": [data]},
                    "n_predict": N_PREDICT,
                    "cache_prompt": False,
                    "return_tokens": True,
                    "stream": False,
                    "n_probs": 2,
                    "post_sampling_probs": False,
                    "ignore_eos": True,
                    **GREEDY_FIELDS,
                }
                t0 = time.monotonic()
                ans = http_json(base + "/completion", body)
                cases.append({
                    "name": name,
                    "image": image,
                    "system": system,
                    "before": before,
                    "after": after,
                    "tokens_evaluated": int(ans["tokens_evaluated"]),
                    "output_tokens": [int(t) for t in ans.get("tokens", [])],
                    "top2_logprobs": top2_from(ans),
                })
                print(f"[vision-parity] {mmproj.name} {image} {name}: {ans['tokens_evaluated']} prompt tokens, "
                      f"{len(cases[-1]['output_tokens'])} out ({time.monotonic() - t0:.1f} s)", flush=True)
    finally:
        child_procs.stop(proc, timeout=15)
    return server_args, cases


def run(args: argparse.Namespace) -> int:
    bin_dir = Path(args.server).parent
    server, cli = Path(args.server), bin_dir / "llama-mtmd-cli"
    for b in (server, cli):
        if not b.is_file():
            raise PeerError(f"{b} not found (run tools/peer/build_llama_cpp.sh)")
    text = FIXTURES / TEXT_MODEL
    out = FIXTURES / "llama_cpp"
    out.mkdir(exist_ok=True)
    for proj in PROJECTORS:
        mmproj = FIXTURES / proj
        with tempfile.TemporaryDirectory() as tmp:
            for image in IMAGES:
                dest = out / f"emb-{stem(proj)}-{stem(image)}.bin"
                shape = embeddings(cli, text, mmproj, FIXTURES / image, Path(tmp) / "emb.bin", args.threads)
                dest.write_bytes((Path(tmp) / "emb.bin").read_bytes())
                print(f"[vision-parity] {dest.name}: {shape[0]} tokens x {shape[1]}", flush=True)
        server_args, cases = greedy_cases(server, text, mmproj, args.threads, args.startup_timeout)
        fixture = {
            "llama_cpp": LLAMA_CPP_ID,
            "model_file": TEXT_MODEL,
            "model_sha256": sha256_file(text),
            "mmproj_file": proj,
            "mmproj_sha256": sha256_file(mmproj),
            "server_args": server_args,
            "n_predict": N_PREDICT,
            "ignore_eos": True,
            "cases": cases,
        }
        dest = out / f"greedy-{stem(proj)}.json"
        dest.write_text(dump_fixture(fixture), encoding="utf-8")
        print(f"[vision-parity] wrote {dest}", flush=True)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", default=str(DEFAULT_SERVER), help="llama-server binary (llama-mtmd-cli beside it)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--startup-timeout", type=float, default=120.0)


if __name__ == "__main__":
    sys.exit(run_main("vision-parity", __doc__, add_arguments, run))
