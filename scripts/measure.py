#!/usr/bin/env python3
"""The house's measures, for a note's before/after table.

Lines per crate (source and tests), files over 600 lines, functions over 80 lines, module
circles (files that reach each other through `crate::`/`super::` paths, a parent's `mod`
line not counted), and sleeps in test code. Reads the tree as text; changes nothing.

    python3 scripts/measure.py [ROOT]
"""
import os
import re
import sys
from collections import defaultdict

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
SKIP = {"target", ".git", "node_modules"}


def rust_files(top):
    for d, dirs, files in os.walk(top):
        dirs[:] = [x for x in dirs if x not in SKIP]
        for f in files:
            if f.endswith(".rs"):
                yield os.path.join(d, f)


def crates():
    """Every crate dir (with a Cargo.toml and a src/) under the host folder, plugins and tests."""
    out = []
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if x not in SKIP]
        if "Cargo.toml" in files and os.path.isdir(os.path.join(d, "src")) and d != ROOT:
            out.append(d)
    return sorted(out)


def count(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return sum(1 for _ in f)


def long_functions(path, limit=80):
    """Functions whose body spans more than `limit` lines (brace matching on text)."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    fn = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")
    i = 0
    while i < len(lines):
        m = fn.match(lines[i])
        if not m:
            i += 1
            continue
        depth, started, j = 0, False, i
        while j < len(lines):
            code = re.sub(r'"(\\.|[^"\\])*"', '""', lines[j].split("//")[0])
            code = re.sub(r"'(\\.|[^'\\])'", "''", code)
            if not started and ";" in code and "{" not in code:
                break
            depth += code.count("{") - code.count("}")
            if "{" in code:
                started = True
            if started and depth <= 0:
                break
            j += 1
        span = j - i + 1
        if started and span > limit:
            out.append((m.group(6), i + 1, span))
        i += 1
    return out


def module_files(src):
    """Map module path (tuple) -> file, for one crate's src/."""
    mods = {}
    for f in rust_files(src):
        rel = os.path.relpath(f, src)[:-3].split(os.sep)
        if rel[-1] in ("mod", "lib", "main"):
            rel = rel[:-1]
        if rel and rel[0] == "bin":
            continue
        mods[tuple(rel)] = f
    return mods


def circles(src):
    mods = module_files(src)
    edges = defaultdict(set)
    path_re = re.compile(r"\b(crate|super)((?:::\w+)+)")
    for m, f in mods.items():
        text = open(f, encoding="utf-8", errors="replace").read()
        text = re.sub(r"//[^\n]*", "", text)
        for head, tail in path_re.findall(text):
            parts = [p for p in tail.split("::") if p]
            base = [] if head == "crate" else list(m[:-1] if not f.endswith(("mod.rs", "lib.rs")) else m)
            if head == "super":
                base = list(m[:-1]) if not f.endswith(("mod.rs",)) else list(m[:-1])
                # `super` from a/b.rs is a; from a/b/mod.rs is a.
                base = list(m[:-1])
                while parts and parts[0] == "super":
                    base = base[:-1]
                    parts = parts[1:]
            full = base + parts
            # the longest module prefix that is a file
            for k in range(len(full), -1, -1):
                t = tuple(full[:k])
                if t in mods:
                    if t != m:
                        edges[m].add(t)
                    break
    # strongly connected components (Tarjan)
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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
                out.append(sorted("::".join(c) or "(root)" for c in comp))

    sys.setrecursionlimit(10000)
    for v in list(mods):
        if v not in index:
            visit(v)
    return out


def main():
    print(f"{'crate':40} {'src':>7} {'tests':>7}")
    total_src = total_tests = 0
    for c in crates():
        src = sum(count(f) for f in rust_files(os.path.join(c, "src")))
        tests = sum(count(f) for f in rust_files(os.path.join(c, "tests"))) + sum(
            count(f) for f in rust_files(os.path.join(c, "benches"))
        )
        total_src += src
        total_tests += tests
        print(f"{os.path.relpath(c, ROOT):40} {src:7} {tests:7}")
    print(f"{'total':40} {total_src:7} {total_tests:7}")

    big, longf, sleeps = [], [], []
    for f in rust_files(ROOT):
        rel = os.path.relpath(f, ROOT)
        n = count(f)
        if n > 600:
            big.append((n, rel))
        for name, line, span in long_functions(f):
            longf.append((span, f"{rel}:{line} {name}"))
        in_tests = "/tests/" in f"/{rel}" or "test-support" in rel or "/peers/" in rel or "/harness/" in rel
        if in_tests:
            lines = open(f, encoding="utf-8", errors="replace").read().split("\n")
            for i, line in enumerate(lines, 1):
                if re.search(r"\b(thread::sleep|time::sleep|tokio::time::sleep|\bsleep)\(", line) and not line.strip().startswith("//"):
                    above = " ".join(lines[max(0, i - 4) : i - 1])
                    if rel.endswith("poll.rs"):
                        kind = "poll"
                    elif "Deliberate:" in above:
                        kind = "deliberate"
                    else:
                        kind = "bare"
                    sleeps.append((kind, f"{rel}:{i}: {line.strip()}"))
    print(f"\nfiles over 600 lines: {len(big)}")
    for n, rel in sorted(big, reverse=True):
        print(f"  {n:5} {rel}")
    print(f"\nfunctions over 80 lines: {len(longf)}")
    for span, what in sorted(longf, reverse=True):
        print(f"  {span:5} {what}")
    total = 0
    print("\nmodule circles:")
    for c in crates():
        for comp in circles(os.path.join(c, "src")):
            total += 1
            print(f"  {os.path.relpath(c, ROOT)}: {' <-> '.join(comp)}")
    print(f"  total: {total}")
    counts = {k: sum(1 for s in sleeps if s[0] == k) for k in ("bare", "deliberate", "poll")}
    print(
        f"\nsleep calls in test code: {len(sleeps)} "
        f"(bare {counts['bare']}, marked deliberate {counts['deliberate']}, the poll's own {counts['poll']})"
    )
    for kind, s in sleeps:
        print(f"  {kind:10} {s}")


if __name__ == "__main__":
    main()
