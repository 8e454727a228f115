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
