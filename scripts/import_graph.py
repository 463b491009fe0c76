"""The package's import structure, measured from the code: `python scripts/import_graph.py`.

Reads every module of rlvla3/ with `ast` (imports inside functions count: a lazy import is still
a dependency) and prints the wings with their modules and lines, the count of top-level modules,
the import circles, the floors (floor 1 imports nothing of the package; a module stands one floor
above the highest module it imports), and every import that breaks the wing rules below. Exits 1
on a circle, a broken rule or an import of a module or name that does not exist; tests run it.
"""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rlvla3"

# A wing may import only the wings listed for it (and itself). The bottom rooms come first.
WINGS = ("config", "notices", "algo", "envs", "policies", "checks", "world", "engine", "cluster", "planner", "tools",
         "benchmarks", "entry points")
MAY_IMPORT = {
    "config": set(),
    "notices": set(),   # stdlib only: env children under another interpreter import it
    "algo": set(),
    "envs": {"config", "notices"},
    "policies": {"config"},
    "checks": {"config", "algo", "envs", "policies"},   # every check before a rank starts
    "world": {"config", "algo", "envs", "policies", "checks"},
    "engine": {"config", "notices", "algo", "envs", "policies", "world"},
    "cluster": {"config", "notices", "world", "engine"},
    "planner": {"config", "world", "engine", "cluster"},
    "tools": {"config", "notices", "algo", "envs", "policies", "world", "engine", "cluster", "planner"},
    "benchmarks": {"config", "notices", "algo", "envs", "policies", "world", "engine", "cluster", "planner", "tools"},
    "entry points": {"cluster", "planner", "tools", "benchmarks"},
}
ENTRY_POINTS = {"launch", "bench", "plan", "collect", "sft", "openloop", "evaluate", "recipe", "scale"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def wing(mod: str) -> str:
    parts = mod.split(".")
    if len(parts) == 1:
        return "package"
    if len(parts) == 2 and parts[1] in ENTRY_POINTS:
        return "entry points"
    return parts[1]


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(mod: str, path: Path, known: dict[str, Path]) -> tuple[set[str], list[str]]:
    """(package modules `mod` imports, problems: imports of missing modules or names)."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out, problems = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = resolve(mod, is_pkg, node)
            targets = [(base, a.name) for a in node.names]
        else:
            continue
        for base, name in targets:
            if not base.startswith("rlvla3"):
                continue
            sub = f"{base}.{name}" if name else None
            if sub in known:
                out.add(sub)          # `from . import shards`: the submodule itself
            elif base in known:
                out.add(base)
                if name and name != "*" and not defines(known[base], name):
                    problems.append(f"{mod}:{node.lineno} imports {name!r} from {base}, which does not define it")
            else:
                problems.append(f"{mod}:{node.lineno} imports {base}, which does not exist")
    out.discard(mod)
    return {m for m in out if m != "rlvla3"}, problems


def defines(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name).split(".")[0] == name
                                                                  for a in node.names):
            return True
    return False


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    memo: dict[str, int] = {}

    def floor(v, seen=()):
        if v not in memo:
            memo[v] = 1 + max((floor(w, (*seen, v)) for w in graph[v] if w not in seen), default=0)
        return memo[v]

    return {v: floor(v) for v in graph}


def rule_breaks(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            wa, wb = wing(a), wing(b)
            if wa != wb and wb not in MAY_IMPORT.get(wa, set()):
                out.append(f"{a} ({wa}) imports {b} ({wb})")
    return out


def measure() -> dict:
    known = modules()
    graph, problems = {}, []
    for mod, path in known.items():
        graph[mod], p = imports_of(mod, path, known)
        problems += p
    graph = {m: {t for t in ts if t in known} for m, ts in graph.items()}
    return {"modules": known, "graph": graph, "problems": problems, "circles": circles(graph),
            "floors": floors(graph), "rule_breaks": rule_breaks(graph)}


def report(m: dict) -> str:
    known, fl = m["modules"], m["floors"]
    lines_of = {mod: len(p.read_text().splitlines()) for mod, p in known.items()}
    by_wing = defaultdict(list)
    for mod in known:
        by_wing[wing(mod)].append(mod)
    out = ["wing          modules  lines  floors"]
    for w in ("package", *WINGS):
        mods = by_wing.get(w, [])
        if mods:
            fs = sorted({fl[x] for x in mods})
            out.append(f"{w:13s} {len(mods):7d} {sum(lines_of[x] for x in mods):6d}  {fs[0]}..{fs[-1]}")
    top = [x for x in known if x.count(".") == 1 and not (PACKAGE / x.split(".")[1]).is_dir()]
    entry = [x for x in top if wing(x) == "entry points"]
    out.append(f"top-level modules in rlvla3/: {len(top)} ({len(top) - len(entry)} modules + {len(entry)} entry points)")
    out.append(f"modules: {len(known)}, imports: {sum(map(len, m['graph'].values()))}, floors: {max(fl.values())}")
    out.append(f"import circles: {len(m['circles'])}")
    out += [f"  circle: {' -> '.join(c)}" for c in m["circles"]]
    out.append(f"imports against the wing rules: {len(m['rule_breaks'])}")
    out += [f"  {r}" for r in m["rule_breaks"]]
    out += [f"  broken import: {p}" for p in m["problems"]]
    return "\n".join(out)


def main() -> int:
    m = measure()
    print(report(m))
    if "--floors" in sys.argv:
        for mod, f in sorted(m["floors"].items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"floor {f:2d}  {mod}")
    return 1 if m["circles"] or m["rule_breaks"] or m["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
