#!/usr/bin/env python3
"""Checks the module graph of src/: no import circles between files, and no arrow from a lower
layer to a higher one. Prints the layers and every offending edge; exits 1 if there is one.

Usage: scripts/module-graph.py [--dot]   (--dot prints the file graph in Graphviz form)
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "src"
# Lowest first; a module may use its own layer or a lower one.
LAYERS = [
    {"sys", "failpoint", "logging"},
    {"vocab"},
    {"config"},
    {"decide"},
    {"host"},
    {"container"},
    {"admin"},
    {"cli", "commands"},
]


def module_of(path):
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [p for p in rel.parts if p not in ("mod", "lib")]
    return "::".join(parts)


def layer_of(mod):
    top = mod.split("::")[0]
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    return None


def resolve(mod, known):
    """The longest known module that `mod` names (an item path ends in a module)."""
    parts = mod.split("::")
    while parts:
        cand = "::".join(parts)
        if cand in known:
            return cand
        parts.pop()
    return None


def edges():
    files = [p for p in ROOT.rglob("*.rs") if "bin" not in p.relative_to(ROOT).parts]
    mods = {module_of(p): p for p in files}
    known = set(mods)
    out = {}
    for mod, path in mods.items():
        text = path.read_text()
        # Only non-test code: cut at the first `#[cfg(test)]`.
        text = text.split("#[cfg(test)]")[0]
        # Comments (doc links included) are not arrows.
        text = re.sub(r"//[^\n]*", "", text)
        targets = set()
        for m in re.finditer(r"crate::([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*)", text):
            t = resolve(m.group(1), known)
            if t:
                targets.add(t)
        for m in re.finditer(r"\buse super::(?:\{([^}]*)\}|([a-z_][a-z0-9_]*))", text):
            base = mod.rsplit("::", 1)[0] if "::" in mod else ""
            if path.name == "mod.rs":
                base = mod
                base = base.rsplit("::", 1)[0] if "::" in base else ""
            names = (m.group(1) or m.group(2) or "").replace("\n", " ").split(",")
            for n in names:
                n = n.strip().split("::")[0].split(" ")[0]
                t = resolve(f"{base}::{n}" if base else n, known) or resolve(base, known)
                if t:
                    targets.add(t)
        # Items of a parent module through `super::` name the parent too.
        targets.discard(mod)
        # A module's own children are not arrows up or circles.
        out[mod] = {t for t in targets if not t.startswith(mod + "::") and t != ""}
    return out


def cycles(graph):
    found, stack, on, idx, low, n = [], [], set(), {}, {}, [0]

    def visit(v):
        idx[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in idx:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in idx:
            visit(v)
    return found


def main():
    graph = edges()
    if "--dot" in sys.argv:
        print("digraph src {")
        for a in sorted(graph):
            for b in sorted(graph[a]):
                print(f'  "{a}" -> "{b}";')
        print("}")
        return 0
    bad = 0
    for comp in cycles(graph):
        print("circle:", " <-> ".join(comp))
        bad += 1
    for a in sorted(graph):
        for b in sorted(graph[a]):
            la, lb = layer_of(a), layer_of(b)
            if la is None or lb is None:
                print(f"unlayered module: {a if la is None else b}")
                bad += 1
            elif lb > la:
                print(f"upward arrow: {a} -> {b}")
                bad += 1
    nedges = sum(len(v) for v in graph.values())
    print(f"{len(graph)} modules, {nedges} arrows, {bad} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
