#!/usr/bin/env python3
"""Runs every PromQL expression of the Grafana dashboards and the recording rules against a
running Prometheus (HTTP API /api/v1/query) and fails on expressions that are invalid or return
no series.

An empty result is tolerated only when every tandem metric the expression reads is absent from
the whole TSDB *and* is listed in allow_empty.txt with a reason (metrics a component does not
export yet, or energy on a host without a power source). Such expressions are printed as
"EMPTY-ALLOWED" with the reason, never silently passed.

usage: check_queries.py PROMETHEUS_URL [DASHBOARD.json ...] --rules RULES.yml
"""
import json
import re
import sys
import urllib.parse
import urllib.request

METRIC = re.compile(r"\b((?:agent|worker)_[a-z0-9_]+|[a-z_]*:[a-z0-9_]+:[a-z0-9_]+)\b")
SUFFIXES = ("_bucket", "_sum", "_count")


def query(base, expr):
    url = base.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:  # 400/422: invalid expression
        return json.load(e)


def rule_exprs(path):
    """(name, expr) of each recording rule, read with a small parser for our rules.yml layout
    (`- record: NAME` followed by `expr: EXPR` on one line); promtool has validated the file."""
    out, name = [], None
    for line in open(path):
        s = line.strip()
        if s.startswith("- record:"):
            name = s.split(":", 1)[1].strip()
        elif s.startswith("expr:") and name:
            out.append((f"rule {name}", s.split(":", 1)[1].strip()))
            name = None
    return out


def dashboard_exprs(path):
    d = json.load(open(path))
    return [(f"{path}: panel {p['title']!r} {t['refId']}", t["expr"]) for p in d["panels"] for t in p.get("targets", [])]


def main(argv):
    base, rest = argv[1], argv[2:]
    rules = rest[rest.index("--rules") + 1]
    dashboards = [a for i, a in enumerate(rest) if a != "--rules" and (i == 0 or rest[i - 1] != "--rules")]
    allow = {}
    for line in open(__file__.rsplit("/", 1)[0] + "/allow_empty.txt"):
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, why = line.partition(" ")
            allow[name] = why.strip()
    exprs = rule_exprs(rules) + [e for d in dashboards for e in dashboard_exprs(d)]
    names = query(base, 'count by (__name__) ({__name__=~"(agent|worker)_.+"})')
    present = {r["metric"]["__name__"] for r in names.get("data", {}).get("result", [])}
    failures = 0
    allowed_rules = {}  # recording rules whose own expression was EMPTY-ALLOWED
    for where, expr in exprs:
        r = query(base, expr)
        if r.get("status") != "success":
            print(f"INVALID       {where}: {expr}\n              {r.get('errorType')}: {r.get('error')}")
            failures += 1
            continue
        n = len(r["data"]["result"]) if r["data"]["resultType"] in ("vector", "matrix") else 1
        if n > 0:
            print(f"OK ({n:>2} series) {where}")
            continue
        read = set(METRIC.findall(expr))
        base_names = set()
        for m in read:
            for suf in SUFFIXES:
                if m.endswith(suf) and m[: -len(suf)] in allow:
                    m = m[: -len(suf)]
            base_names.add(m)
        scraped = {m for m in read if m in present}
        reasons = [allow.get(m) or allowed_rules.get(m) for m in base_names]
        if base_names and not scraped and all(reasons):
            why = "; ".join(sorted(set(reasons)))
            print(f"EMPTY-ALLOWED {where}: {expr}\n              not exported here: {', '.join(sorted(base_names))} ({why})")
            if where.startswith("rule "):
                allowed_rules[where[5:]] = why
        else:
            print(f"EMPTY         {where}: {expr}\n              scraped metrics it reads: {sorted(scraped) or 'none'}")
            failures += 1
    print(f"{len(exprs)} expressions, {failures} failed; tandem metrics scraped: {len(present)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
