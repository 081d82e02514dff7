#!/usr/bin/env python3
"""Plots a replay's per-step figures from the replay JSONL (agent-gateway replay --out): step
latency (gateway step_ms, worker prefill and decode ms) and prompt tokens per step (new vs
reused against the KV-cache bound).

usage: plot_replay.py REPLAY.jsonl OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    rows = [json.loads(l) for l in open(src) if l.strip()]
    if not rows:
        sys.exit(f"{src}: no steps")
    x = list(range(len(rows)))
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    a.plot(x, [r["step_ms"] for r in rows], "o-", label="step (gateway)")
    a.plot(x, [r["prefill_ms"] for r in rows], "s--", label="prefill (worker)")
    a.plot(x, [r["decode_ms"] for r in rows], "^--", label="decode (worker)")
    a.set_ylabel("ms")
    a.set_title(f"replay of {rows[0]['episode']} ({len(rows)} steps)", fontsize=9)
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
    new = [r["new_tokens"] for r in rows]
    reused = [r["reused_tokens"] for r in rows]
    b.bar(x, reused, label="reused prompt tokens", color="tab:green")
    b.bar(x, new, bottom=reused, label="new (prefilled) prompt tokens", color="tab:orange")
    b.plot(x, [r["kv_bound_tokens"] for r in rows], "k_", markersize=18, mew=2, label="KV bound (LCP)")
    b.set_xlabel("step")
    b.set_ylabel("tokens")
    b.legend(fontsize=8)
    b.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(dst, dpi=100)
    print(f"wrote {dst}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
