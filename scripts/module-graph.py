#!/usr/bin/env python3
"""Checks the module graph of every crate of the workspace (the root Cargo.toml's `members`,
each crate's library or binary sources: gpushare's src/, the limiter, the simulated driver, ...):
no import circles between files in any crate, and, in gpushare's src/, no arrow from a lower
layer to a higher one (sys/failpoint/logging < vocab < config < decide < host < container <
admin < cli). Prints every offending edge; exits 1 if there is one.

Reads `crate::` paths (`crate::{a, b::{c, d}}` groups expanded) and `super::` paths (repeated
ones climb further); `#[cfg(test)]` items, wherever they sit, and test-module files are not
part of the graph.

Usage: scripts/module-graph.py [--dot | --layers | --self-test] [--root DIR]
  --dot prints gpushare's file graph in Graphviz form; --layers prints it by layer (each layer's
  modules, and how many arrows go from it to each lower layer); --self-test checks the parser on
  the forms above and that a circle is reported; --root checks the workspace at DIR (default:
  this one). The check also fails when docs/design.md's copy of the --layers drawing (the fenced
  block after the line `<!-- module-graph.py --layers -->`) is not what --layers prints now.
"""
import pathlib
import re
import sys
import tomllib

WORKSPACE = pathlib.Path(__file__).resolve().parent.parent
ROOT = WORKSPACE / "src"
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


def module_of(path, root=None):
    rel = path.relative_to(root or ROOT).with_suffix("")
    parts = [p for p in rel.parts if p not in ("mod", "lib", "main")]
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


def strip_comments(text):
    """Removes // and /* */ comments (doc links included are not arrows), leaving strings."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def item_end(text, i):
    """The index just past the item starting at `i`: its `;` or its matching `}`."""
    depth, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        elif c == ";" and depth == 0:
            return i + 1
        i += 1
    return n


TEST_ATTR = re.compile(r"#\[cfg\(test\)\]")


def production(text):
    """`text` without its `#[cfg(test)]` items (a test module anywhere in the file, production
    code after it kept), and the names of test modules declared in other files (`mod x;`)."""
    out, test_mods, i = [], set(), 0
    for m in TEST_ATTR.finditer(text):
        if m.start() < i:
            continue
        out.append(text[i : m.start()])
        j = m.end()
        # Further attributes of the same item.
        while True:
            k = re.match(r"\s*#\[[^\]]*\]", text[j:])
            if not k:
                break
            j += k.end()
        decl = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([a-z_][a-z0-9_]*)\s*;", text[j:])
        if decl:
            test_mods.add(decl.group(1))
        i = item_end(text, j)
    out.append(text[i:])
    return "".join(out), test_mods


def expand(prefix, body):
    """The paths of a `use` tree body `a, b::c, d::{e, f}` under `prefix`."""
    parts, depth, cur = [], 0, ""
    for c in body:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    out = []
    for p in parts:
        p = re.sub(r"\s+", "", p)
        if not p or p == "self":
            out.append(prefix)
            continue
        p = p.split("as")[0] if "::" not in p else p
        g = re.match(r"^((?:[a-z_][a-z0-9_]*::)*)\{(.*)\}$", p, re.S)
        if g:
            out.extend(expand(prefix + "::" + g.group(1).rstrip(":"), g.group(2)) if g.group(1) else expand(prefix, g.group(2)))
        else:
            out.append(prefix + "::" + re.sub(r"(?i)as[a-z_0-9]+$", "", p) if prefix else p)
    return [o.replace("::::", "::").strip(":") for o in out]


def paths_after(text, head):
    """Every path `head::…` or `head::{…}` in `text`, groups expanded, without `head`."""
    out = []
    for m in re.finditer(r"\b" + head + r"::", text):
        rest = text[m.end() :]
        if rest.startswith("{"):
            end = item_end("{" + rest[1:], 0)
            out.extend(expand("", rest[1 : end - 1]))
            continue
        pm = re.match(r"[a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*(?:::\{)?", rest)
        if not pm:
            continue
        path = pm.group(0)
        if path.endswith("::{"):
            start = pm.end() - 1
            end = start + item_end(rest[start:], 0)
            out.extend(expand(path[:-3], rest[start + 1 : end - 1]))
        else:
            out.append(path)
    return out


def edges(root=None):
    """The production file graph of the crate whose sources are under `root` (src/bin, thin
    binaries of their own, left out)."""
    root = root or ROOT
    files = [p for p in root.rglob("*.rs") if "bin" not in p.relative_to(root).parts]
    mods = {module_of(p, root): p for p in files}
    texts, test_files = {}, set()
    for mod, path in mods.items():
        text, test_mods = production(strip_comments(path.read_text()))
        texts[mod] = text
        parent = mod if path.name in ("mod.rs", "lib.rs") else mod.rsplit("::", 1)[0] if "::" in mod else ""
        for t in test_mods:
            test_files.add(f"{parent}::{t}" if parent else t)
    # Files that are test modules (`#[cfg(test)] mod tests;`), and their children, are no part
    # of the production graph.
    prod = {m for m in mods if not any(m == t or m.startswith(t + "::") for t in test_files)}
    known = set(prod)
    out = {}
    for mod in sorted(prod):
        text = texts[mod]
        targets = set()
        for p in paths_after(text, "crate"):
            t = resolve(p, known)
            if t:
                targets.add(t)
        # `super::` (repeated: `super::super::`) is relative to the module's parent.
        here = mod.split("::") if mod else []
        for m in re.finditer(r"\b((?:super::)+)", text):
            ups = m.group(1).count("super::")
            base = here[: max(len(here) - ups, 0)]
            rest = text[m.end() :]
            if rest.startswith("{"):
                end = item_end(rest, 0)
                names = expand("", rest[1 : end - 1])
            else:
                pm = re.match(r"[a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*", rest)
                names = [pm.group(0)] if pm else [""]
            for n in names:
                full = "::".join(base + ([n] if n else []))
                t = resolve(full, known) or resolve("::".join(base), known)
                if t:
                    targets.add(t)
        targets.discard(mod)
        # A module's own children are not arrows up or circles.
        out[mod] = {t for t in targets if not t.startswith(mod + "::") and t != ""}
    return out


def self_test():
    """The parser on the forms it must read; exits non-zero when one is misread."""
    text = strip_comments(
        "use crate::{a, b::c, d::{e, f as g}};\n"
        "// crate::comment\n"
        "#[cfg(test)]\nmod tests { use crate::testonly; fn f() { crate::inner(); } }\n"
        "fn after() { crate::late::x(); }\n"
        "#[cfg(test)]\nmod more;\n"
        "use super::super::up;\n"
    )
    prod, test_mods = production(text)
    got = sorted(paths_after(prod, "crate"))
    want = ["a", "b::c", "d::e", "d::f", "late::x"]
    assert got == want, (got, want)
    assert "testonly" not in prod and "comment" not in prod, prod
    assert test_mods == {"more"}, test_mods
    assert "super::super::up" in prod
    # A circle through `crate::` and `super::` arrows is found, a parent's use of its child is not.
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        src = pathlib.Path(d)
        (src / "lib.rs").write_text("mod a; mod b; mod c; fn f() { crate::a::x(); }\n")
        (src / "a.rs").write_text("use crate::b::y;\n")
        (src / "b.rs").write_text("fn g() { super::a::x(); }\n")
        (src / "c.rs").write_text("use crate::a;\n")
        got = cycles(edges(src))
        assert got == [["a", "b"]], got
        (src / "b.rs").write_text("fn g() {}\n")
        assert cycles(edges(src)) == []
        # The design doc's copy of the drawing is read back exactly; without the mark, None.
        doc = src / "design.md"
        doc.write_text(f"text\n{DOC_MARK}\n```\nvocab: 1 files\n  vocab\n```\nmore\n")
        assert doc_drawing(doc) == "vocab: 1 files\n  vocab\n", doc_drawing(doc)
        doc.write_text("no drawing\n")
        assert doc_drawing(doc) is None
    print("self-test ok")


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


def crate_roots(workspace):
    """(crate name, source dir) of every member of the workspace at `workspace`: the directory of
    its library (or binary) root file."""
    ws = tomllib.loads((workspace / "Cargo.toml").read_text())
    out = []
    for member in ws["workspace"]["members"]:
        d = workspace / member
        manifest = tomllib.loads((d / "Cargo.toml").read_text())
        name = manifest["package"]["name"]
        lib = manifest.get("lib", {}).get("path")
        if lib:
            src = (d / lib).parent
        elif (d / "src" / "lib.rs").exists() or (d / "src" / "main.rs").exists():
            src = d / "src"
        else:
            continue
        out.append((name, src.resolve()))
    return out


LAYER_NAMES = ["sys, failpoint, logging", "vocab", "config", "decide", "host", "container",
               "admin", "cli, commands"]
DOC_MARK = "<!-- module-graph.py --layers -->"


def layers_drawing(graph):
    """gpushare's src/ by layer, highest first: each layer's modules (files grouped by their first
    two path parts, with their file count where more than one) and its arrows down, counted per
    lower layer."""
    out = []
    for i in reversed(range(len(LAYERS))):
        mods = sorted(m for m in graph if layer_of(m) == i)
        groups = {}
        for m in mods:
            key = "::".join(m.split("::")[:2])
            groups[key] = groups.get(key, 0) + 1
        names = [k if n == 1 else f"{k} ({n})" for k, n in sorted(groups.items())]
        down = {}
        for a in mods:
            for b in graph[a]:
                lb = layer_of(b)
                if lb is not None and lb < i:
                    down[lb] = down.get(lb, 0) + 1
        out.append(f"{LAYER_NAMES[i]}: {len(mods)} files")
        line = "  "
        for n in names:
            if len(line) + len(n) + 2 > 96:
                out.append(line.rstrip())
                line = "  "
            line += n + ", "
        out.append(line.rstrip(", "))
        arrows = ", ".join(f"{LAYER_NAMES[j]} {down[j]}" for j in sorted(down, reverse=True))
        out.append(f"  arrows down: {arrows or 'none'}")
    return "\n".join(out) + "\n"


def doc_drawing(doc):
    """The fenced block after DOC_MARK in `doc`, or None."""
    text = doc.read_text()
    if DOC_MARK not in text:
        return None
    rest = text.split(DOC_MARK, 1)[1].lstrip("\n")
    if not rest.startswith("```"):
        return None
    body = rest.split("\n", 1)[1]
    return body.split("```", 1)[0]


def main():
    if "--self-test" in sys.argv:
        self_test()
        return 0
    workspace = WORKSPACE
    if "--root" in sys.argv:
        workspace = pathlib.Path(sys.argv[sys.argv.index("--root") + 1]).resolve()
    root = workspace / "src"
    graph = edges(root)
    if "--layers" in sys.argv:
        print(layers_drawing(graph), end="")
        return 0
    if "--dot" in sys.argv:
        print("digraph src {")
        for a in sorted(graph):
            for b in sorted(graph[a]):
                print(f'  "{a}" -> "{b}";')
        print("}")
        return 0
    bad = 0
    crates = 0
    for name, src in crate_roots(workspace):
        if src == root.resolve():
            continue
        crates += 1
        other = edges(src)
        for comp in cycles(other):
            print(f"circle in {name}:", " <-> ".join(comp))
            bad += 1
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
    doc = workspace / "docs" / "design.md"
    if doc.exists() and doc_drawing(doc) != layers_drawing(graph):
        print(f"{doc}: the drawing after `{DOC_MARK}` is not what --layers prints now; "
              "paste the output of `scripts/module-graph.py --layers` there")
        bad += 1
    nedges = sum(len(v) for v in graph.values())
    print(f"src/: {len(graph)} modules, {nedges} arrows; {crates} other crate(s); {bad} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
