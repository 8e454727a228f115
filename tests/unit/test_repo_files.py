"""Checks on the repository's own files that no other test would notice.

A merge once committed its conflict markers into docs/BROKERS.md and
docs/OPERATIONS.md (both sides of a table row, a stray heading), and nothing
failed: docs are read by people, not by the suite.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_MARKER = re.compile(r"^(<{7}( |$)|={7}$|>{7}( |$))", re.MULTILINE)


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    keep = (".md", ".py", ".yml", ".yaml", ".toml", ".sh", ".json", ".txt", ".cfg", ".ini")
    return [ROOT / name for name in out.splitlines() if name.endswith(keep) or "/" not in name and "." not in name]


def test_no_merge_conflict_markers_in_tracked_files() -> None:
    files = _tracked_text_files()
    assert len(files) > 50, "git ls-files found too few files to be this repository"
    bad = []
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in _MARKER.finditer(text):
            bad.append(f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}")
    assert not bad, "merge conflict markers: " + ", ".join(bad)


# ----------------------------------------------------------------------------- structure
PACKAGES = ("pipeline", "consumers", "models", "ops")


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(path: Path, mods: dict[str, Path]) -> set[str]:
    """Every module of ours `path` imports, at the top or inside a function (a local
    import still ties the two modules together), except under TYPE_CHECKING."""
    import ast

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found.update(r for r in map(resolve, names) if r)
    return found


def test_no_import_cycles() -> None:
    """Modules that import each other (even lazily) cannot be understood, tested or
    moved apart; pipeline/app/serve.py and pipeline/commands/run.py, models/text/build.py
    and models/text/model.py were two such pairs."""
    mods = _modules()
    graph = {name: _imports(path, mods) - {name} for name, path in mods.items()}
    # A package imports its own modules in __init__ (re-exports): not a cycle of design.
    for name in graph:
        graph[name] = {d for d in graph[name] if not name.startswith(d + ".")}
    cycles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(v: str) -> None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                cycles.append(" -> ".join([*path[path.index(w):], w]))
            elif w not in state:
                visit(w)
        path.pop()
        state[v] = 2

    for v in sorted(graph):
        if v not in state:
            visit(v)
    assert not cycles, "import cycles: " + "; ".join(cycles)


# The size a reader holds in their head. A module that must grow past it gets an
# entry here with its size and a reason, and may then only shrink.
MAX_LINES = 400
OVERSIZE: dict[str, int] = {}  # none at present


def test_pipeline_modules_stay_small() -> None:
    too_big = []
    for path in sorted((ROOT / "pipeline").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > OVERSIZE.get(rel, MAX_LINES):
            too_big.append(f"{rel}: {lines} lines (limit {OVERSIZE.get(rel, MAX_LINES)})")
    assert not too_big, "; ".join(too_big)


# ----------------------------------------------------------------------------- citations
_MD_NAME = re.compile(r"(?<![\w./-])([\w./-]*\w\.md)(?![\w-])")
_URL = re.compile(r"\w+://\S+")
# A path into the design notes' folder, which lives outside the repository.
_OUTSIDE = re.compile(r"(?<![\w./-])(?:\.\./)*shared/|/work/shared\b")


def _resolves(name: str, citing: str, tracked: set[str]) -> bool:
    """A cited .md file exists if the name is a tracked path from the repository root or
    from the citing file's folder; a bare name may also be a tracked file below that
    folder (a script naming the file it writes), and markdown pages may cite docs/ pages
    by bare name (the README's list of docs)."""
    import posixpath

    folder = posixpath.dirname(citing)
    candidates = [name, posixpath.normpath(posixpath.join(folder, name))]
    if citing.endswith(".md"):
        candidates.append("docs/" + name)
    if any(c in tracked for c in candidates):
        return True
    if "/" not in name:
        prefix = folder + "/" if folder else ""
        return any(t.startswith(prefix) and t.endswith("/" + name) for t in tracked)
    return False


def test_cited_markdown_files_exist() -> None:
    """Comments and docs once cited design notes that sit outside the repository (the
    broker's defects, the models' measured costs, the metric conventions) as if users
    could read them. Every .md file a tracked file names must be in the repository,
    and nothing may point into the notes' folder."""
    tracked = set(
        subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.splitlines()
    )
    this = str(Path(__file__).resolve().relative_to(ROOT))  # its patterns would match themselves
    bad = []
    for path in _tracked_text_files():
        rel = str(path.relative_to(ROOT))
        if rel == this or rel.startswith("out/") or not path.is_file():
            continue
        text = _URL.sub(" ", path.read_text(encoding="utf-8", errors="replace"))
        for m in _MD_NAME.finditer(text):
            if text[max(0, m.start() - 3):m.start()] in ('/ "', "/ '"):
                continue  # a pathlib join (`REPO / "docs" / "X.md"`): its code reads it
            if not _resolves(m.group(1), rel, tracked):
                bad.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(1)}")
        for m in _OUTSIDE.finditer(text):
            bad.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}")
    assert not bad, "cited files that are not in the repository: " + ", ".join(bad)
