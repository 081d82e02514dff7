#!/usr/bin/env python3
"""Fails when ARCHITECTURE.md names a file or folder that does not exist.

Every backticked word of ARCHITECTURE.md that looks like a repository path (it contains a
`/` and ends in a file extension or a `/`, e.g. `dsp/src/gdn/chunked.rs`, `state/planner/`)
is checked against the tree; paths given relative to a crate's `src/` in the crate
sections (`engine/actor.rs` under **`device-worker/`**) are looked up under every crate's
`src/` too. Prints the missing ones and exits 1 when there is one:

    tools/check_architecture_paths.py [ARCHITECTURE.md]
"""
from __future__ import annotations

import glob
import os
import re
import sys

PATH = re.compile(r"`([A-Za-z0-9_.\-/]+)`")
LOOKS_LIKE_PATH = re.compile(r"/|\.(rs|py|sh|md|toml|proto|json|gguf|yml|yaml)$")


def exists(root: str, p: str) -> bool:
    p = p.rstrip("/")
    if os.path.exists(os.path.join(root, p)):
        return True
    # Paths written relative to a crate's source folder.
    return any(os.path.exists(os.path.join(d, p)) for d in glob.glob(os.path.join(root, "*/src")))


def main() -> int:
    doc = sys.argv[1] if len(sys.argv) > 1 else "ARCHITECTURE.md"
    root = os.path.dirname(os.path.abspath(doc))
    text = open(doc, encoding="utf-8").read()
    named, missing = set(), []
    for m in PATH.finditer(text):
        p = m.group(1)
        if p.startswith(("http", "-")) or "://" in p or not LOOKS_LIKE_PATH.search(p):
            continue
        if "." not in os.path.basename(p.rstrip("/")) and not p.endswith("/"):
            continue  # `a/b` words such as `tokio/rayon`, not paths
        named.add(p)
        if not exists(root, p):
            missing.append(p)
    for p in sorted(set(missing)):
        print(f"missing: {p}")
    print(f"{len(named)} paths named in {doc}, {len(set(missing))} missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
