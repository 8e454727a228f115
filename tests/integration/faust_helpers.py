"""The Faust example app (examples/faust_ctr) as a subprocess, for the tests that run it
(tests/integration/test_faust_app.py, test_faust_own_model.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from consumers.brokers.embedded import free_port
from tests.integration.pipeline_helpers import REPO, profile_of


@contextmanager
def faust_worker(
    bootstrap: str, inp: str, out: str, app_id: str, tmp_path: Path, name: str, *, level: str = "info", **env: str
) -> Iterator[tuple[subprocess.Popen, int, Path]]:
    """The example app as a `faust ... worker -l level` process; stopped with SIGTERM at exit."""
    web_port = free_port()
    log = tmp_path / f"{name}.log"
    full_env = {
        **os.environ,
        "TIDEBATCH_FAUST_BROKER": f"kafka://{bootstrap}",
        "TIDEBATCH_FAUST_BROKER_PROFILE": profile_of(bootstrap),
        "TIDEBATCH_FAUST_APP_ID": app_id,
        "TIDEBATCH_FAUST_INPUT": inp,
        "TIDEBATCH_FAUST_OUTPUT": out,
        "TIDEBATCH_FAUST_PROVIDERS": "cpu",
        **env,  # wins: e.g. the profile of a listener profile_of() does not know
    }
    cmd = [
        sys.executable, "-m", "faust", "--datadir", str(tmp_path / f"{name}-data"),
        "-A", "examples.faust_ctr.app", "worker", "-l", level,
        "--web-port", str(web_port), "--web-host", "127.0.0.1",
    ]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=full_env, cwd=REPO)
    try:
        yield proc, web_port, log
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode
