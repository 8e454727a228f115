"""README's first command, `tidebatch demo`, end to end on the embedded broker (it
starts its own Tansu and worker): every request scored once, the invalid ones
dead-lettered, the worker exits 0, and the files it points at exist. Nothing else in
the suite ran the demo, so a refactor could break README's first command unnoticed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_demo_scores_every_request_once_and_says_where_to_look(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "demo", "--duration", "3", "--rate", "200", "--out", str(out), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["requests_sent"] > 0
    assert summary["requests_scored"] == summary["requests_sent"]
    assert summary["missing"] == 0 and summary["duplicates"] == 0
    assert summary["dead_lettered"] == summary["invalid_sent"] > 0
    assert summary["worker_exit_code"] == 0
    for key in ("summary", "sample_results", "worker_log", "broker_log"):
        assert Path(summary["where"][key]).is_file(), key
    assert json.loads((out / "summary.json").read_text())["requests_scored"] == summary["requests_scored"]
