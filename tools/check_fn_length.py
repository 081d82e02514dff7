#!/usr/bin/env python3
"""Lists the functions longer than a limit (default 120 lines) under the given folders.

Counts from a `fn` line to its closing brace (brace matching over the code with comments
and string literals skipped; doc comments and attributes above the `fn` are not counted).
Exits 1 when one is longer, so it can run in CI:

    tools/check_fn_length.py device-worker/src/engine device-worker/src/model [--max 120]
"""
from __future__ import annotations

import argparse
import os
import re
import sys

FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+\"C\"\s+)?fn\s+(\w+)")


def code_chars(line: str, state: dict) -> str:
    """The line without comments and string contents (block comments may span lines)."""
    out, i = [], 0
    while i < len(line):
        if state["block"]:
            j = line.find("*/", i)
            if j < 0:
                return "".join(out)
            state["block"], i = False, j + 2
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["block"], i = True, i + 2
            continue
        if c == '"':
            j = i + 1
            while j < len(line) and line[j] != '"':
                j += 2 if line[j] == "\\" else 1
            i = j + 1
            continue
        if c == "'" and i + 2 < len(line) and (line[i + 2] == "'" or line[i + 1] == "\\"):
            j = line.find("'", i + 2)
            i = (j + 1) if j > 0 else i + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def long_functions(path: str, limit: int):
    lines = open(path, encoding="utf-8").read().splitlines()
    state = {"block": False}
    clean = [code_chars(l, state) for l in lines]
    for i, l in enumerate(lines):
        m = FN.match(l)
        if not m:
            continue
        depth, started = 0, False
        for j in range(i, len(lines)):
            for ch in clean[j]:
                if ch == "{":
                    depth, started = depth + 1, True
                elif ch == "}":
                    depth -= 1
            if started and depth == 0:
                n = j - i + 1
                if n > limit:
                    yield m.group(7), i + 1, n
                break
            if not started and clean[j].rstrip().endswith(";"):
                break  # a declaration without a body (trait method)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--max", type=int, default=120)
    a = ap.parse_args()
    bad = 0
    longest = (0, "")
    for folder in a.folders:
        for d, _, fs in os.walk(folder):
            for f in sorted(fs):
                if f.endswith(".rs"):
                    p = os.path.join(d, f)
                    for name, line, n in long_functions(p, 0):
                        if n > longest[0]:
                            longest = (n, f"{p}:{line} {name}")
                        if n > a.max:
                            print(f"{p}:{line}: fn {name} is {n} lines (limit {a.max})")
                            bad += 1
    print(f"longest function: {longest[1]} ({longest[0]} lines); {bad} over {a.max}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
