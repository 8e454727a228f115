"""A private redis-server on a free loopback port, for tests that need a Redis of their
own: exact command statistics (nobody else talks to it) or killing it mid-stream.

    with redis_server(tmp_path) as server:
        server.url            # redis://127.0.0.1:<port>/0
        server.kill()         # SIGKILL: an outage (no persistence: data is gone)
        server.start()        # again, on the same port

Secured, as production runs it (tests/integration/test_redis_secured.py):

    RedisServer(workdir, user="tidebatch", password="s3cret",   # ACL user; `default` off
                tls=make_cert(ca, pki, "redis", ["127.0.0.1"]),  # TLS port only
                client_tls=make_cert(ca, pki, "client"))         # client certs required
    server.url                # rediss://127.0.0.1:<port>/0 (never a password in it)
    server.redis_section()    # the worker's `redis` keys that reach it

With `password` and no `user`, the server uses `requirepass` (the `default` user).
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
from tests.integration.certs import CertFiles

START_TIMEOUT_S = 20.0


class RedisServer:
    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        *,
        user: str | None = None,
        password: str | None = None,
        tls: CertFiles | None = None,
        client_tls: CertFiles | None = None,
    ) -> None:
        """user/password: an ACL user allowed tb:* keys only, or `requirepass` when
        user is None. tls: the server's certificate; the plain port is then off.
        client_tls: a client certificate for client(); the server then requires one
        from every client (tls-auth-clients yes), else it asks for none."""
        assert user is None or password is not None, "an ACL user needs a password"
        assert client_tls is None or tls is not None, "client certificates need tls"
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH (scripts/ensure_redis.sh installs it)")
        self.binary = binary
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.log_path = workdir / "redis.log"
        self.proc: subprocess.Popen | None = None
        self.user, self.password, self.tls, self.client_tls = user, password, tls, client_tls

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    def redis_section(self) -> dict[str, Any]:
        """The worker config's `redis` keys that reach this server."""
        keys: dict[str, Any] = {"url": self.url}
        if self.user is not None:
            keys["username"] = self.user
        if self.password is not None:
            keys["password"] = self.password
        if self.tls is not None:
            keys["tls_ca_file"] = str(self.tls.ca)
        if self.client_tls is not None:
            keys.update(tls_cert_file=str(self.client_tls.cert), tls_key_file=str(self.client_tls.key))
        return keys

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> RedisServer:
        """Start (or restart, on the same port) and wait until it answers PING."""
        assert not self.running, "already running"
        cmd = [
            self.binary, "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--daemonize", "no",
            "--dir", str(self.workdir), "--logfile", str(self.log_path),
            *self._security_args(),
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

    def _security_args(self) -> list[str]:
        args: list[str] = []
        if self.tls is None:
            args += ["--port", str(self.port)]
        else:
            args += [
                "--port", "0", "--tls-port", str(self.port),
                "--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key),
                "--tls-ca-cert-file", str(self.tls.ca),
                "--tls-auth-clients", "yes" if self.client_tls else "no",
            ]
        if self.user is not None:
            # Least privilege, as an operator would grant it: tidebatch's keys only;
            # the `default` user (no password) is switched off.
            args += ["--user", self.user, "on", f">{self.password}", "~tb:*", "+@all", "--user", "default", "off"]
        elif self.password is not None:
            args += ["--requirepass", self.password]
        return args

    def client(self, **kwargs: Any) -> redis.Redis:
        """A client with this server's credentials and TLS settings; kwargs win."""
        auth: dict[str, Any] = {"username": self.user, "password": self.password}
        if self.tls is not None:
            auth.update(ssl=True, ssl_ca_certs=str(self.tls.ca))
        if self.client_tls is not None:
            auth.update(ssl_certfile=str(self.client_tls.cert), ssl_keyfile=str(self.client_tls.key))
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True, **{**auth, **kwargs})

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
def redis_server(workdir: Path, port: int | None = None, **security: Any) -> Iterator[RedisServer]:
    """security: RedisServer's user, password, tls, client_tls."""
    server = RedisServer(workdir, port, **security).start()
    try:
        yield server
    finally:
        server.stop()
