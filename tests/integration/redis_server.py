"""A private redis-server on a free loopback port, for tests that need a Redis of their
own: exact command statistics (nobody else talks to it) or killing it mid-stream.

    with redis_server(tmp_path) as server:
        server.url            # redis://127.0.0.1:<port>/0
        server.kill()         # SIGKILL: an outage (no persistence: data is gone)
        server.start()        # again, on the same port
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from consumers.brokers.embedded import free_port

START_TIMEOUT_S = 20.0


class RedisServer:
    def __init__(self, workdir: Path, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH (scripts/ensure_redis.sh installs it)")
        self.binary = binary
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.log_path = workdir / "redis.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> RedisServer:
        """Start (or restart, on the same port) and wait until it answers PING."""
        assert not self.running, "already running"
        cmd = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--daemonize", "no",
            "--dir", str(self.workdir), "--logfile", str(self.log_path),
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {self._log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server did not answer on port {self.port}: {self._log_tail()}")
            time.sleep(0.02)
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash would; returns once the process is reaped."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True, **kwargs)

    def _answers(self) -> bool:
        with contextlib.suppress(redis.RedisError), self.client(socket_timeout=0.5) as c:
            return bool(c.ping())
        return False

    def _log_tail(self) -> str:
        try:
            return " | ".join(self.log_path.read_text().splitlines()[-5:])
        except OSError:
            return "(no log)"


@contextlib.contextmanager
def redis_server(workdir: Path, port: int | None = None) -> Iterator[RedisServer]:
    server = RedisServer(workdir, port).start()
    try:
        yield server
    finally:
        server.stop()
