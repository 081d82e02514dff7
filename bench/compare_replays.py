#!/usr/bin/env python3
"""Compares two replay JSONL files (`agent-gateway replay --out`) step by step: the model's
raw output, the parsed action, the error, and the token accounting (prompt, reused, new,
decode tokens and passes). For "behaviour unchanged" checks between two builds:

    bench/compare_replays.py old/replay.jsonl new/replay.jsonl

Prints one line per differing step and a summary; exits 1 when any step differs (timings
are never compared).
"""
from __future__ import annotations

import json
import sys

FIELDS = ["raw_output", "action", "error", "prompt_tokens", "reused_tokens", "new_tokens",
          "decode_tokens", "decode_passes"]


def load(path: str) -> dict[tuple[str, int], dict]:
    steps = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                if "episode" in r and "step" in r:
                    steps[(r["episode"], r["step"])] = r
    return steps


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    old, new = load(sys.argv[1]), load(sys.argv[2])
    differ = 0
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a is None or b is None:
            print(f"{key[0]} step {key[1]}: only in {'new' if a is None else 'old'}")
            differ += 1
            continue
        diffs = [f"{f}: {a.get(f)!r} -> {b.get(f)!r}" for f in FIELDS if a.get(f) != b.get(f)]
        if diffs:
            differ += 1
            print(f"{key[0]} step {key[1]}: " + "; ".join(diffs))
    n = len(set(old) | set(new))
    print(f"{n} steps compared ({len(FIELDS)} fields each), {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
