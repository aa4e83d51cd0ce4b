#!/usr/bin/env python3
"""Prints each crate's module import graph (from `use crate::` / `super::` paths and
`crate::x::` mentions) and any cycle in it, then checks the crates' own arrows: each
workspace crate sits on a floor (FLOORS, lowest first) and may depend, in its
[dependencies], only on crates of lower floors. Exit status 1 on a module cycle or a
crate arrow that points up (or a crate without a floor).

    python3 scripts/import-graph.py [--edges]
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates")


def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return rel


def resolve(mods, here, target):
    """The longest known module that `target` (a path list from the crate root) names."""
    for n in range(len(target), 0, -1):
        if tuple(target[:n]) in mods:
            return tuple(target[:n])
    return None


def paths(text):
    """Every `crate::`/`super::` path in `text`, with `{a::b, c}` groups expanded."""
    out = []
    for m in re.finditer(r"\b(?:crate|super|self)(?:::\w+)*::\{", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        prefix = m.group(0)[:-3]
        for item in split_top(text[m.end():i - 1]):
            item = item.strip()
            if item and item != "self":
                out.append(prefix + "::" + re.split(r"[\s{]", item)[0].rstrip(":"))
    out += re.findall(r"\b((?:crate|super)(?:::\w+)+)", text)
    return out


def split_top(body):
    parts, depth, cur = [], 0, ""
    for ch in body:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def graph(src):
    files = []
    for d, _, fs in os.walk(src):
        files += [os.path.join(d, f) for f in fs if f.endswith(".rs")]
    mods = {tuple(module_of(src, f)): f for f in files}
    edges = {m: set() for m in mods}
    for m, f in mods.items():
        text = open(f).read()
        # unit tests may import anything of their parent; they are not architecture
        text = re.split(r"#\[cfg\(test\)\]\s*mod tests", text)[0]
        for path in paths(text):
            parts = path.split("::")
            if parts[0] == "crate":
                target = parts[1:]
            else:
                # `super` of a/b.rs is a; of a/mod.rs, the crate root
                target = list(m)
                while parts and parts[0] in ("super", "self"):
                    if parts[0] == "super":
                        target = target[:-1]
                    parts = parts[1:]
                target += parts
            t = resolve(mods, m, target)
            # a module's own children and the crate root re-exports are not edges
            if t is None or t == m or t == () or t[: len(m)] == m:
                continue
            edges[m].add(t)
    # an edge into a parent module counts only when the parent is more than declarations
    return edges


def cycles(edges):
    found, state = [], {}

    def visit(n, stack):
        state[n] = 1
        stack.append(n)
        for t in sorted(edges.get(n, ())):
            if state.get(t) == 1:
                found.append(stack[stack.index(t):] + [t])
            elif state.get(t) is None:
                visit(t, stack)
        stack.pop()
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n, [])
    return found


# The crates, lowest floor first: the arithmetic, the library, what runs on it (the
# Redis module beside the servers' runtime), the offline tools, then the load
# generators (which draw the offline tools' traffic), the decision service and the
# proxy, the console over the service and the offline tools, the binary on top. The test kit is a
# dev-dependency only and stands apart.
FLOORS = [
    ["tollgate-core"],
    ["tollgate"],
    ["tollgate-redis-module", "tollgate-runtime"],
    ["tollgate-offline"],
    ["tollgate-bench", "tollgate-service", "tollgate-proxy"],
    ["tollgate-console"],
    ["tollgate-server"],
]
APART = ["tollgate-testkit"]


def workspace_deps(crate):
    """The workspace crates in `crate`'s [dependencies] (not its dev-dependencies)."""
    deps, section = [], None
    for line in open(os.path.join(ROOT, crate, "Cargo.toml")):
        line = line.strip()
        if line.startswith("["):
            section = line
            continue
        m = re.match(r"([\w-]+)(?:\.workspace)?\s*=", line)
        if section == "[dependencies]" and m and m.group(1).startswith("tollgate"):
            deps.append(m.group(1))
    return deps


def crate_arrows(show):
    """Prints the crates' arrows; True when one points up or sideways."""
    floor = {c: i for i, cs in enumerate(FLOORS) for c in cs}
    bad = False
    if show:
        print("## crates")
    for crate in sorted(os.listdir(ROOT)):
        if not os.path.isfile(os.path.join(ROOT, crate, "Cargo.toml")) or crate in APART:
            continue
        if crate not in floor:
            print(f"crate {crate}: on no floor (scripts/import-graph.py FLOORS)")
            bad = True
            continue
        deps = workspace_deps(crate)
        if show and deps:
            print(f"  {crate} -> {', '.join(sorted(deps))}")
        for d in deps:
            if d in APART or floor.get(d, len(FLOORS)) >= floor[crate]:
                print(f"crate {crate} -> {d}: points up (or sideways)")
                bad = True
    return bad


def main():
    show = "--edges" in sys.argv
    bad = crate_arrows(show)
    for crate in sorted(os.listdir(ROOT)):
        src = os.path.join(ROOT, crate, "src")
        if not os.path.isdir(src):
            continue
        edges = graph(src)
        name = lambda m: "::".join(m) or "(root)"
        if show:
            print(f"## {crate}")
            for m in sorted(edges):
                if edges[m]:
                    print(f"  {name(m)} -> {', '.join(sorted(name(t) for t in edges[m]))}")
        for c in cycles(edges):
            bad = True
            print(f"{crate}: cycle {' -> '.join(name(m) for m in c)}")
    if not bad:
        print("no cycles, no crate arrow up")
    sys.exit(1 if bad else 0)


main()
