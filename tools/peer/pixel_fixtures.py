#!/usr/bin/env python3
"""llama.cpp's own preprocessed pixels as references for the screenshot path (issue 19).

Compiles ``tools/peer/llama_pixels.cpp`` against the vendored llama.cpp of the peer
(``tools/peer/build_llama_cpp.sh``: its headers and static ``libmtmd``/``libllama``/``libggml``)
into ``$TANDEM_CACHE/peer/llama_pixels`` and runs it for each case in ``CASES``: the
projector's Qwen-VL preprocessor (``mtmd_image_preprocessor_dyn_size``: llama.cpp's sizing,
``PAD_CEIL`` bicubic resize, ``u8 / 255`` then ``(v − mean) / std``) on the stb_image-decoded
image, with the case's ``--image-min-tokens`` / ``--image-max-tokens``. The f32 pixels
(row-major ``[y][x][c]``, RGB interleaved, little-endian: the buffer ``clip`` encodes) become
``device-worker/tests/fixtures/qwen35vl/llama_cpp/pixels.json``:

* per case: ``name``, ``source`` (``fixture``: a file of the fixture folder; ``corpus``: a path
  under the corpus ``raw/`` folder), ``path``, ``min_tokens``, ``max_tokens``, ``source_size``
  and ``size`` (``[width, height]``), ``band_rows`` (32), ``band_sha256`` (hex SHA-256 of each
  band of 32 rows of f32 bytes, top to bottom, the last band shorter if the height is not a
  multiple), ``sha256`` (all bytes), ``rows`` (the middle row's index → its f32 bytes,
  base64, when the full pixels are not committed), and ``full`` (a file beside the JSON holding all the f32 bytes, or null);
* top level: ``llama_cpp``, ``mmproj_file``, ``mmproj_sha256``, ``layout``.

The full pixels are committed for the small case only (``pixels-<name>.f32``); the larger
ones as band checksums, a mismatching band naming the rows to look at. Read by
``device-worker/tests/vision_parity.rs`` (``preprocessed_pixels_are_bit_identical_to_llama_cpp``). Not part of CI (~20 s once the peer is built)::

    python3 tools/peer/pixel_fixtures.py [--corpus DIR]

Python 3.11 standard library only; a C++17 compiler (``c++``).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parity_fixtures import (  # noqa: E402  (tools/peer/parity_fixtures.py)
    DEFAULT_CACHE,
    DEFAULT_SERVER,
    LLAMA_CPP_ID,
    PeerError,
    dump_fixture,
    run_main,
    sha256_file,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "device-worker" / "tests" / "fixtures" / "qwen35vl"
SOURCE = Path(__file__).resolve().parent / "llama_pixels.cpp"
MMPROJ = "mmproj-tiny-qwen35vl-f32.gguf"
BAND_ROWS = 32
DEFAULT_CORPUS = Path(os.environ.get("TANDEM_CORPUS", str(ROOT.parent / "shared" / "corpus" / "raw")))

# (name, source, path, min_tokens, max_tokens, full pixels committed). 8..4096 is llama.cpp's
# default budget for qwen3vl_merger (the worker's too); 1024 is deploy/demo.sh's.
CASES = [
    # 270×600 → 32×128 (content 32×72, 8.4× down, rows padded): needs resizing, small.
    ("screenshot-270x600-max8", "fixture", "screenshot-270x600.png", 8, 8, True),
    # 270×600 → 256×608 (content 256×569): the embedding parity's input.
    ("screenshot-270x600", "fixture", "screenshot-270x600.png", 8, 4096, False),
    # 256×384: sides multiples of 32, no resize.
    ("crop-256x384", "fixture", "crop-256x384.png", 8, 4096, False),
    # A real 1080×2400 screenshot → 672×1504 (content 672×1494), the demo's budget.
    ("trace_18-0-max1024", "corpus", "llamatouch_evaluator/trace_18/0.png", 8, 1024, False),
    # The same at the default budget → 1088×2400 (content 1080×2400 unresized, 4 px black each side).
    ("trace_18-0", "corpus", "llamatouch_evaluator/trace_18/0.png", 8, 4096, False),
]


def build(llama: Path, dest: Path) -> Path:
    """Compiles llama_pixels.cpp into `dest` unless `dest` is newer than the source; returns it."""
    if dest.is_file() and dest.stat().st_mtime > SOURCE.stat().st_mtime:
        return dest
    b = llama / "build"
    libs = ["tools/mtmd/libmtmd.a", "src/libllama.a", "ggml/src/libggml.a", "ggml/src/libggml-cpu.a",
            "ggml/src/libggml-base.a", "vendor/hash/libvendor-hash.a"]
    for lib in libs:
        if not (b / lib).is_file():
            raise PeerError(f"{b / lib} not found (run tools/peer/build_llama_cpp.sh)")
    includes = [llama / "tools" / "mtmd", llama / "ggml" / "include", llama / "include", llama / "vendor"]
    cmd = ["c++", "-std=c++17", "-O1", *[f"-I{i}" for i in includes], str(SOURCE),
           *[str(b / lib) for lib in libs], "-lpthread", "-fopenmp", "-o", str(dest)]
    print(f"[pixels] {' '.join(cmd)}", flush=True)
    if subprocess.run(cmd).returncode != 0:
        raise PeerError("compiling llama_pixels.cpp failed")
    return dest


def pixels(tool: Path, mmproj: Path, image: Path, min_tokens: int, max_tokens: int) -> tuple[list[int], list[int], bytes]:
    """Runs the tool; returns (source [w, h], size [w, h], f32 bytes)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pixels.bin"
        r = subprocess.run([str(tool), str(mmproj), str(image), str(min_tokens), str(max_tokens), str(out)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise PeerError(f"llama_pixels {image.name}: {r.stderr.strip().splitlines()[-1:]}")
        raw = out.read_bytes()
    sx, sy, nx, ny = struct.unpack("<4i", raw[:16])
    data = raw[16:]
    if len(data) != nx * ny * 3 * 4:
        raise PeerError(f"{image.name}: {len(data)} bytes for {nx}x{ny}x3 f32")
    return [sx, sy], [nx, ny], data


def case_entry(name: str, source: str, path: str, lo: int, hi: int, src: list[int], size: list[int],
               data: bytes, full: str | None) -> dict:
    """One `pixels.json` case (format in the module docstring)."""
    row = size[0] * 3 * 4
    bands = [hashlib.sha256(data[y * row:(y + BAND_ROWS) * row]).hexdigest() for y in range(0, size[1], BAND_ROWS)]
    picks = [] if full else [size[1] // 2]
    return {
        "name": name, "source": source, "path": path, "min_tokens": lo, "max_tokens": hi,
        "source_size": src, "size": size, "band_rows": BAND_ROWS, "band_sha256": bands,
        "sha256": hashlib.sha256(data).hexdigest(),
        "rows": {str(y): base64.b64encode(data[y * row:(y + 1) * row]).decode() for y in picks},
        "full": full,
    }


def run(args: argparse.Namespace) -> int:
    llama = Path(args.server).parents[2]
    tool = build(llama, DEFAULT_CACHE / "peer" / "llama_pixels")
    mmproj = FIXTURES / MMPROJ
    out = FIXTURES / "llama_cpp"
    out.mkdir(exist_ok=True)
    cases = []
    for name, source, path, lo, hi, keep in CASES:
        image = (FIXTURES if source == "fixture" else args.corpus) / path
        if not image.is_file():
            raise PeerError(f"{image} not found (--corpus or TANDEM_CORPUS for corpus images)")
        src, size, data = pixels(tool, mmproj, image, lo, hi)
        full = None
        if keep:
            full = f"pixels-{name}.f32"
            (out / full).write_bytes(data)
        cases.append(case_entry(name, source, path, lo, hi, src, size, data, full))
        print(f"[pixels] {name}: {src[0]}x{src[1]} -> {size[0]}x{size[1]} ({lo}..{hi} tokens)", flush=True)
    fixture = {
        "llama_cpp": LLAMA_CPP_ID,
        "mmproj_file": MMPROJ,
        "mmproj_sha256": sha256_file(mmproj),
        "layout": "f32 little-endian, row-major [y][x][c], RGB: clip_image_f32 after normalize",
        "cases": cases,
    }
    dest = out / "pixels.json"
    dest.write_text(dump_fixture(fixture), encoding="utf-8")
    print(f"[pixels] wrote {dest}", flush=True)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", default=str(DEFAULT_SERVER),
                   help="llama-server of the peer build (its llama.cpp tree is compiled against)")
    p.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS,
                   help="corpus raw/ folder (default: $TANDEM_CORPUS, else ../shared/corpus/raw)")


if __name__ == "__main__":
    sys.exit(run_main("pixels", __doc__, add_arguments, run))
