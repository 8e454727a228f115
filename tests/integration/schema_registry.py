"""A real schema registry for the tests: Apicurio Registry (tests/integration/apicurio_dist.py
fetches it) as a child JVM on a free loopback port, spoken to through its
Confluent-compatible API.

    with SchemaRegistry(tmp_path) as registry:
        SchemaRegistryClient({"url": registry.url})   # http://127.0.0.1:<port>/apis/ccompat/v7
        registry.stop(); registry.start()             # an outage; same port, same schemas

Storage is H2: in memory, or a file under `data_dir` when one is given, so that a
stop() and start() keep every schema and id (a registry outage, not a wiped registry).
stop() is SIGTERM, which lets H2 write; kill() is SIGKILL and may lose the last second.
The JVM's output goes to `log_path`; a start that fails names its telling line and the
log's last lines.

`python -m tests.integration.schema_registry fetch` (scripts/ensure_registry.sh) fetches
the pinned version and makes its class-data archive with one training start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Sequence
from pathlib import Path

from consumers.brokers.embedded import HOST, _pdeathsig_preexec, _terminate, free_port
from consumers.brokers.kafka_node import telling_line
from tests.integration.apicurio_dist import (
    RegistryDistError,
    apicurio_home,
    cds_archive,
    ensure_dist,
    java_binary,
    pinned_version,
    runner_jar,
)

CCOMPAT_PATH = "/apis/ccompat/v7"
# 2.6 starts in 2.6-6 s here (docs/SCHEMA_REGISTRY.md); a loaded 2-core machine is slower.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
_POLL_S = 0.1
_LOG_TAIL_LINES = 20
_PORT_ATTEMPTS = 3
# What Quarkus logs when its port was taken between free_port() and its bind.
_PORT_TAKEN = "seems to be in use by another process"
# As for the Kafka JVMs (consumers/brokers/kafka_process.py): a small heap, and start-up over
# peak speed (C1 only) since a test registry serves a few requests.
JVM_FLAGS: tuple[str, ...] = (
    "-Xms64m", "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Djava.awt.headless=true",
)


class RegistryError(RuntimeError):
    """The registry did not start or answer."""


class _PortTaken(RegistryError):
    """Retried on other ports when we picked them."""


def read_log(path: Path, offset: int = 0) -> str:
    """The log from byte `offset` on (where this start began writing)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return "(no log)"


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    return "\n".join(read_log(path).splitlines()[-lines:])


class SchemaRegistry:
    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        *,
        data_dir: Path | None = None,
        version: str | None = None,
        java: str | None = None,
        jvm_flags: Sequence[str] = JVM_FLAGS,
    ) -> None:
        """workdir: the log (and nothing else). data_dir: H2 files there (kept across
        stop/start), else in memory. version/java: the pinned Apicurio and `java`
        (apicurio_dist.py: env overrides)."""
        self.version = version or pinned_version()
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        # Ports we picked may be taken before the JVM binds them: then pick others, but
        # only before the first start (a restart keeps the URL its clients have).
        self._pick_ports = port is None
        self._log_offset = 0
        # 3.x also opens a management interface (health, metrics); 2.x ignores the key.
        self.management_port = free_port()
        self.data_dir = data_dir
        self.java = java
        self.jvm_flags = tuple(jvm_flags)
        self.log_path = workdir / "registry.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize | None = None

    @property
    def url(self) -> str:
        """The Confluent-compatible base URL (what SchemaRegistryClient takes)."""
        return f"http://{HOST}:{self.port}{CCOMPAT_PATH}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self, dist: Path, cds: Path | None = None, *, train: bool = False) -> list[str]:
        """The JVM command line; with `cds`, mapped (or, train=True, written at exit)."""
        java = self.java or java_binary()
        flags = list(self.jvm_flags)
        if cds is not None:
            flags.append(f"-XX:{'ArchiveClassesAtExit' if train else 'SharedArchiveFile'}={cds}")
        props = [
            f"-Dquarkus.http.host={HOST}", f"-Dquarkus.http.port={self.port}",
            f"-Dquarkus.management.host={HOST}", f"-Dquarkus.management.port={self.management_port}",
        ]
        return [java, *flags, *props, "-jar", str(runner_jar(dist))]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            url = f"jdbc:h2:file:{self.data_dir / 'registry'}"
            # 2.x reads REGISTRY_DATASOURCE_URL, 3.x apicurio.datasource.url (its env form).
            env["REGISTRY_DATASOURCE_URL"] = env["APICURIO_DATASOURCE_URL"] = url
        return env

    def start(self, timeout: float = START_TIMEOUT_S, *, train: bool = False) -> SchemaRegistry:
        """Start and wait until the Confluent API lists subjects. train=True writes the
        class-data archive at exit (ensure step); otherwise it is used when present."""
        if self.running:
            return self
        for attempt in range(_PORT_ATTEMPTS):
            try:
                self._start(timeout, train=train)
                self._pick_ports = False
                return self
            except _PortTaken:
                if not self._pick_ports or attempt == _PORT_ATTEMPTS - 1:
                    raise
                self.port, self.management_port = free_port(), free_port()
        raise AssertionError("unreachable")

    def _start(self, timeout: float, *, train: bool) -> None:
        home = apicurio_home(self.version)
        dist = ensure_dist(self.version, home)
        cds = cds_archive(home)
        cmd = self.command(dist, cds if train or cds.is_file() else None, train=train)
        with open(self.log_path, "ab") as log_file:
            self._log_offset = log_file.tell()
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,  # Ctrl-C reaches only us; we stop it ourselves
                preexec_fn=_pdeathsig_preexec(),  # no orphan JVM if Python dies
            )
        # atexit + GC safety net: the JVM is stopped even if stop() is never called.
        self._finalizer = weakref.finalize(self, _terminate, self.proc, STOP_TIMEOUT_S)
        try:
            self._wait_ready(time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> int | None:
        """SIGTERM (H2 writes its file), SIGKILL after STOP_TIMEOUT_S; the exit code."""
        if self._finalizer is None:
            return None
        code = self._finalizer()
        self._finalizer = None
        return code

    def kill(self) -> None:
        """SIGKILL: a crash. In-memory storage loses everything, file storage may lose
        the last second of writes."""
        if self.running:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
        self.stop()

    def answers(self, timeout: float = 2.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=timeout) as resp:
                return resp.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def _wait_ready(self, deadline: float) -> None:
        assert self.proc is not None
        while not self.answers(timeout=min(2.0, max(deadline - time.monotonic(), 0.1))):
            code = self.proc.poll()
            if code is not None:
                log = read_log(self.log_path, self._log_offset)
                raise (_PortTaken if _PORT_TAKEN in log else RegistryError)(
                    f"Apicurio Registry {self.version} exited during start (code {code}): "
                    f"{telling_line(log)}; see {self.log_path}:\n"
                    f"{log_tail(self.log_path)}"
                )
            if time.monotonic() >= deadline:
                raise RegistryError(
                    f"Apicurio Registry {self.version} did not answer on {self.url} in time; "
                    f"see {self.log_path}:\n{log_tail(self.log_path)}"
                )
            time.sleep(_POLL_S)

    def __enter__(self) -> SchemaRegistry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"SchemaRegistry(apicurio {self.version}, {self.url}, {'running' if self.running else 'stopped'})"


def ensure_registry(workdir: Path) -> tuple[Path, float]:
    """Fetch the pinned version, and when its class-data archive is missing, make it with
    one training start (which also proves the registry starts). (dist, seconds of the
    training start, 0 when none was needed)."""
    version = pinned_version()
    home = apicurio_home(version)
    dist = ensure_dist(version, home)
    if cds_archive(home).is_file():
        return dist, 0.0
    began = time.monotonic()
    registry = SchemaRegistry(workdir, version=version)
    registry.start(train=True)
    took = time.monotonic() - began
    registry.stop()  # the JVM writes the archive on its way out
    return dist, took


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m tests.integration.schema_registry fetch` (scripts/ensure_registry.sh):
    one line, exit 0; or exit 1 with the reason (after a failed start, the log's tail)."""
    import argparse
    import sys
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m tests.integration.schema_registry")
    parser.add_argument("action", choices=["fetch"])
    parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tidebatch-registry-") as tmp:
        try:
            dist, trained = ensure_registry(Path(tmp))
        except (RegistryDistError, RegistryError) as exc:
            print(f"registry: error: {exc}", file=sys.stderr)
            return 1
    note = f"; started once in {trained:.1f} s to make its class-data archive" if trained else ""
    print(f"registry: Apicurio Registry {pinned_version()} in {dist}{note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
