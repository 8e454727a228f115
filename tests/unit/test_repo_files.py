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


# ----------------------------------------------------------------------------- sizes
# What a reader takes in at once (issue 45): no Python file over it, tests and benches
# included, but the builds of the shipped models (models/*/build.py: one graph written
# out from end to end). A file listed in SPLITTING is being split on a branch of its
# own, at its size then; the entry goes when the split lands (the test says so).
MAX_FILE_LINES = 450
SPLITTING: dict[str, int] = {}  # none at present


def _repo_files(*patterns: str) -> list[str]:
    """Tracked files and new ones git does not ignore (not .venv, not out/)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *patterns],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    return sorted({name for name in out.splitlines() if (ROOT / name).is_file()})


def _is_model_build(rel: str) -> bool:
    parts = rel.split("/")
    return len(parts) == 3 and parts[0] == "models" and parts[2] == "build.py"


def test_no_python_file_is_over_the_limit() -> None:
    files = _repo_files("*.py")
    assert len(files) > 100, "git ls-files found too few files to be this repository"
    too_big, done = [], []
    for rel in files:
        if _is_model_build(rel):
            continue
        lines = (ROOT / rel).read_bytes().count(b"\n")  # as `wc -l` counts them
        limit = SPLITTING.get(rel, MAX_FILE_LINES)
        if lines > limit:
            too_big.append(f"{rel}: {lines} lines (limit {limit})")
        elif rel in SPLITTING and lines <= MAX_FILE_LINES:
            done.append(rel)
    done += [rel for rel in SPLITTING if rel not in files]
    assert not too_big, "split by job, not in halves: " + "; ".join(too_big)
    assert not done, f"split now: drop {done} from SPLITTING"


# ----------------------------------------------------------------------------- cited paths
# A path into the repository as comments, docstrings and docs write it: from one of
# these folders down, e.g. pipeline/worker/core.py, bench/burst.py, docs/BROKERS.md.
_CITED_PATH = re.compile(
    r"(?<![\w./~$-])((?:pipeline|consumers|tests|bench|scripts|docs|models)/[\w.*/<>-]*[\w*/>])"
)
# Words that stand for a name the reader picks (pipeline/curves/NAME.json).
_PLACEHOLDERS = {"NAME", "BROKER", "ENGINE", "PIPELINE", "VERSION", "N"}
# A user's own file in an example (models/my-ranker/1/model.onnx), not ours.
_USERS_OWN = re.compile(r"(my|your)[-_]")


def _comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of the comments and of every string standing alone as a statement
    (docstrings, and strings used as comments) of a Python file. A comment is what
    follows a '#' on its line: a '#' inside a string literal passes for one too, which
    only makes the check stricter. Not tokenize: four times slower on 500 files."""
    import ast

    source = path.read_text(encoding="utf-8")
    if not _CITED_PATH.search(source):
        return []
    found = [(i, line[line.index("#"):]) for i, line in enumerate(source.splitlines(), 1) if "#" in line]
    statements: list[ast.AST] = [ast.parse(source)]
    while statements:  # statements only: a docstring is one, and expressions are most nodes
        node = statements.pop()
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, field, None) or ():
                if isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant):
                    if isinstance(child.value.value, str):
                        found.append((child.lineno, child.value.value))
                elif isinstance(child, ast.AST):
                    statements.append(child)
    return found


def _cited_path_resolves(path: str, files: set[str], folders: set[str]) -> bool:
    import fnmatch

    path = path.rstrip("/")
    if path in files or path in folders:
        return True
    parts = path.split("/")
    if any(_USERS_OWN.match(part) for part in parts):
        return True
    # module.attribute: pipeline/kafka_backend.group_overrides
    folder, _, last = path.rpartition("/")
    names = last.split(".")
    if any(f"{folder}/{'.'.join(names[:i])}.py" in files for i in range(1, len(names))):
        return True
    # globs and placeholders: tests/unit/test_ops_*.py, pipeline/curves/NAME.json
    pattern = "/".join(
        "*" + part[len(part.split(".")[0]):] if part.split(".")[0] in _PLACEHOLDERS or "<" in part else part
        for part in parts
    )
    if "*" in pattern:
        return any(fnmatch.fnmatchcase(name, pattern) for name in files | folders)
    # a build output git ignores on purpose (models/text/minilm-fp32-v1.onnx)
    return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0


def test_cited_repository_paths_exist() -> None:
    """Comments once cited pipeline/profiling/kafka_stage.py, a module no commit ever
    had, and files a restructuring moved stay cited at their old place. Every path into
    the repository that a Python comment or docstring, a page of docs/ or the README
    names must be there (a glob must match something)."""
    files = set(_repo_files())
    folders = {str(parent) for name in files for parent in Path(name).parents if str(parent) != "."}
    this = str(Path(__file__).resolve().relative_to(ROOT))  # its patterns would match themselves
    texts: list[tuple[str, int, str]] = []
    for rel in sorted(files):
        if rel.endswith(".py") and rel != this:
            texts += [(rel, line, text) for line, text in _comments_and_docstrings(ROOT / rel)]
        elif rel == "README.md" or rel.startswith("docs/") and rel.endswith(".md"):
            texts.append((rel, 1, _URL.sub(" ", (ROOT / rel).read_text(encoding="utf-8"))))
    bad = [
        f"{rel}:{line + text.count(chr(10), 0, m.start())}: {m.group(1)}"
        for rel, line, text in texts
        for m in _CITED_PATH.finditer(text)
        if not _cited_path_resolves(m.group(1), files, folders)
    ]
    assert not bad, "cited paths that are not in the repository: " + ", ".join(bad)
