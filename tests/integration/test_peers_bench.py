"""bench/peers.py runs its rows in --quick on the embedded broker (issue 23): tidebatch's
and the plain loops' drains, and a live load; the quixstreams and Bytewax rows when
.venv-peers exists (bench/peers/setup.sh), else skipped. Every request scored once,
with the model's own scores; no timing is asserted (the figures are docs/PEERS.md's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PEERS_VENV = REPO / ".venv-peers" / "bin" / "python"


def bench(results: Path, *args: str) -> dict:
    cmd = [sys.executable, str(REPO / "bench" / "peers.py"), "--broker", "embedded", "--quick",
           "--encodings", "json", "--results", str(results), *args]
    done = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(results.read_text())


def test_tidebatch_and_plain_loop_rows(tmp_path: Path) -> None:
    # Drains, then live loads at fractions of the capacities the drains just measured.
    data = bench(tmp_path / "peers.json", "--part", "all", "--only", "loop-64,tidebatch-static")
    assert set(data["drain"]) == {"loop-64:json", "tidebatch-static:json"}
    for key, (run,) in data["drain"].items():
        # correct: every request scored, scores within 1e-6 of the model's own.
        assert run["correct"] and run["scored"] == run["sent"] == 200, (key, run)
    assert data["model_peak"][0]["rows_per_s"] > 0
    for name in ("loop-64", "tidebatch-static"):
        for label, run in data["live"][name].items():
            assert run["sent"] > 0 and run["scored"] == run["sent"], (name, label, run)
            assert {"generator", "worker", "broker"} <= set(run["cpu_cores"])


@pytest.mark.skipif(not PEERS_VENV.exists(), reason=".venv-peers is absent (bench/peers/setup.sh makes it)")
def test_quixstreams_and_bytewax_rows(tmp_path: Path) -> None:
    data = bench(tmp_path / "peers.json", "--part", "drain", "--only", "quix-message,bytewax")
    for key in ("quix-message:json", "bytewax:json"):
        (run,) = data["drain"][key]
        assert run["correct"], (key, run)
