#!/usr/bin/env python3
"""Hot loops of functions in `aarch64-linux-gnu-objdump -d --no-show-raw-insn -C` output.

Usage: insn_loops.py DISASSEMBLY FUNCTION [--sdot N] [--with M] [--without M] [--nth K] [--list]
  A loop is a branch (b, b.cond, cbz, cbnz, tbz, tbnz) to an address at or before itself in
  the same function; its body is the instructions from the target to the branch, inclusive
  (a static range: it also counts cold paths inside it that a run skips).
  The hot loop is the innermost (shortest) loop with the most `sdot` instructions, or with
  exactly N (--sdot N). Where one function holds several such kernels (a `match` over kinds),
  --with M / --without M keep the candidates whose hot loop has / lacks mnemonic M, and
  --nth K picks the K-th (from 0) of the disjoint candidate loops left, in address order.
  Prints one JSON line: {"function", "insns" (hot loop length), "sdot", "inner_loops"
  (loops nested inside it: a static count then undercounts their repeats), "loops" (with
  --list: every loop as [start, end, insns, sdot])}.
Code whose hot path spans several loops with run-time bounds (the K-quant tile's row and
token loops) has no such loop: insn_exec.py counts executed instructions instead.
"""
import json
import re
import sys

BRANCH = re.compile(r"^(b|b\.\w+|cbz|cbnz|tbz|tbnz)$")


def functions(path):
    """Yields (name, [(addr, mnemonic, operands)]) for each function in the disassembly."""
    name, insns = None, []
    head = re.compile(r"^[0-9a-f]+ <(.*)>:$")
    line_re = re.compile(r"^\s+([0-9a-f]+):\s+(\S+)\s*(.*)$")
    with open(path, errors="replace") as f:
        for line in f:
            m = head.match(line.rstrip("\n"))
            if m:
                if name is not None:
                    yield name, insns
                name, insns = m.group(1), []
                continue
            m = line_re.match(line.rstrip("\n"))
            if m and name is not None:
                insns.append((int(m.group(1), 16), m.group(2), m.group(3)))
    if name is not None:
        yield name, insns


def loops(insns):
    """[(start index, end index)] of every backward branch."""
    index = {a: i for i, (a, _, _) in enumerate(insns)}
    out = []
    for i, (a, mn, ops) in enumerate(insns):
        if not BRANCH.match(mn):
            continue
        m = re.search(r"(?:^|,\s*)([0-9a-f]+) <", ops)
        if not m:
            continue
        t = int(m.group(1), 16)
        if t <= a and t in index:
            out.append((index[t], i))
    return out


def arg(flag, default):
    return sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv else default


def main():
    path, want = sys.argv[1], sys.argv[2]
    for name, insns in functions(path):
        if name != want:
            continue
        ls = loops(insns)
        sd = lambda s, e: sum(1 for _, mn, _ in insns[s:e + 1] if mn == "sdot")
        rows = [(s, e, e - s + 1, sd(s, e)) for s, e in ls]
        if not rows:
            print(json.dumps({"function": name, "error": "no loop"}))
            return
        want_sdot = int(arg("--sdot", max(r[3] for r in rows)))
        cand = sorted((r for r in rows if r[3] == want_sdot), key=lambda r: (r[0], -r[1]))
        # Disjoint clusters of candidate loops; in each, the innermost (shortest).
        clusters = []
        for r in cand:
            if clusters and r[0] <= clusters[-1][-1][1]:
                clusters[-1].append(r)
            else:
                clusters.append([r])
        mns = lambda r: {mn for _, mn, _ in insns[r[0]:r[1] + 1]}
        inner_most = lambda c: min(c, key=lambda r: r[2])
        if "--with" in sys.argv:
            clusters = [c for c in clusters if arg("--with", "") in mns(inner_most(c))]
        if "--without" in sys.argv:
            clusters = [c for c in clusters if arg("--without", "") not in mns(inner_most(c))]
        nth = int(arg("--nth", 0))
        if not clusters or nth >= len(clusters):
            print(json.dumps({"function": name, "error": f"no loop #{nth} with {want_sdot} sdot"}))
            sys.exit(1)
        best = inner_most(clusters[nth])
        inner = [r for r in rows if r != best and best[0] <= r[0] and r[1] <= best[1]]
        res = {"function": name, "insns": best[2], "sdot": best[3], "inner_loops": len(inner),
               "at": [insns[best[0]][0], insns[best[1]][0]]}
        if "--list" in sys.argv:
            res["loops"] = [[insns[s][0], insns[e][0], n, k] for s, e, n, k in rows]
        print(json.dumps(res))
        return
    print(json.dumps({"function": want, "error": "not found"}))
    sys.exit(1)


if __name__ == "__main__":
    main()
