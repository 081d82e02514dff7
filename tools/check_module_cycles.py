#!/usr/bin/env python3
"""Fails when the top-level modules of a crate depend on each other in a cycle.

Reads every `.rs` file under SRC (e.g. device-worker/src), maps it to its top-level module
(`engine/actor.rs` -> `engine`), and collects the edges module -> module from the paths the
code names: `crate::x::..`, `super::x` resolved against the file's own module path, and
`use crate::{x, y}` groups. Comments, doc comments and `#[cfg(test)] mod tests` blocks are
ignored (tests may reach anywhere). Prints the edges and every cycle (a strongly connected
component of more than one module); exits 1 when there is one.

    tools/check_module_cycles.py device-worker/src [--depth 2]

`--depth 2` checks second-level modules (`state/planner`) as nodes instead.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from collections import defaultdict


def module_path(root: str, path: str) -> list[str]:
    parts = os.path.relpath(path, root)[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts


def strip(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    src = "\n".join(line.split("//", 1)[0] for line in src.splitlines())
    # drop `#[cfg(test)] mod name { ... }` blocks (brace matching)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(pub(\([a-z]+\))?\s+)?mod\s+\w+\s*\{", src):
        if m.start() < i:
            continue
        out.append(src[i:m.start()])
        depth, j = 1, m.end()
        while j < len(src) and depth:
            depth += {"{": 1, "}": -1}.get(src[j], 0)
            j += 1
        i = j
    out.append(src[i:])
    return "".join(out)


def targets(src: str, here: list[str]) -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()
    for m in re.finditer(r"\bcrate::\{([^}]*)\}", src):
        for item in m.group(1).split(","):
            name = item.strip().split("::")[0]
            if re.fullmatch(r"[a-z_][a-z0-9_]*", name):
                found.add((name,))
    for m in re.finditer(r"\bcrate::([a-z_][a-z0-9_]*)(?:::([a-z_][a-z0-9_]*))?", src):
        found.add(tuple(x for x in m.groups() if x))
    for m in re.finditer(r"\b((?:super::)+)([a-z_][a-z0-9_]*)", src):
        up = m.group(1).count("super::")
        base = here[: max(len(here) - up, 0)]
        found.add(tuple(base + [m.group(2)]))
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("--depth", type=int, default=1)
    a = ap.parse_args()
    files = [os.path.join(d, f) for d, _, fs in os.walk(a.src) for f in fs if f.endswith(".rs")]
    modules = {tuple(module_path(a.src, f)[: a.depth]) for f in files}
    edges: dict[tuple, set[tuple]] = defaultdict(set)
    for f in files:
        here = module_path(a.src, f)
        me = tuple(here[: a.depth])
        if not me:
            continue  # lib.rs / main.rs declare and wire modules
        for t in targets(strip(open(f, encoding="utf-8").read()), here):
            node = t[: a.depth]
            # a path into a module file (`state::slot`) counts at the depth asked; items of
            # a folder's mod.rs (`crate::state::Slot`) count as the folder
            while node and node not in modules:
                node = node[:-1]
            if node and node != me and node[: len(me)] != me and me[: len(node)] != node:
                edges[me].add(node)
    for m in sorted(edges):
        print("/".join(m), "->", ", ".join("/".join(t) for t in sorted(edges[m])))
    index: dict = {}
    low: dict = {}
    stack: list = []
    on: set = set()
    cycles: list = []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted("/".join(x) for x in comp))

    sys.setrecursionlimit(10000)
    for v in sorted(set(edges) | {t for ts in edges.values() for t in ts}):
        if v not in index:
            visit(v)
    if cycles:
        for c in cycles:
            print("CYCLE:", " <-> ".join(c))
        return 1
    print(f"no module cycle in {a.src} (depth {a.depth})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
