"""One node of a local Apache Kafka (consumers/brokers/kafka.py): its ports, folder and
JVM handle (KafkaNode), how a cluster's nodes are laid out, its cluster id, and what
its log says when it fails.
"""

from __future__ import annotations

import base64
import contextlib
import shutil
import subprocess
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from consumers.brokers.embedded import HOST, free_port, port_in_use
from consumers.brokers.kafka_fetch import KafkaBrokerError


@dataclass
class KafkaNode:
    """One broker+controller JVM. Its ports and folder stay the same across restarts."""

    node_id: int
    port: int
    controller_port: int
    dir: Path
    # The secured listeners' ports by name (SASL_SSL, MTLS, OAUTH), when the broker is secured.
    secure_ports: dict[str, int] = field(default_factory=dict)
    # Where it listens and advertises, and the network namespace it runs in (None: this
    # one): tests/integration/netns.py puts each node in its own to cut links.
    host: str = HOST
    netns: str | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    finalizer: weakref.finalize | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.dir / "server.log"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def failure_line(path: Path) -> str:
    """The most telling line of a node's log (see telling_line)."""
    try:
        return telling_line(path.read_text(errors="replace"))
    except OSError:
        return "(no log)"


def telling_line(text: str) -> str:
    """The exception message after the last ERROR (Kafka logs "Exiting Kafka due to fatal
    exception", then the cause), else the last exception message (StorageTool prints
    only a stack trace), else the last ERROR line, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return "(empty log)"
    errors = [i for i, line in enumerate(lines) if " ERROR " in line]
    start = errors[-1] + 1 if errors else 0
    causes = [
        line for line in lines[start:]
        if ("Exception: " in line or "Error: " in line) and not line.startswith("at ")
    ]
    if causes:
        return causes[0] if errors else causes[-1]
    return lines[errors[-1]] if errors else lines[-1]


def log_says_port_taken(path: Path) -> bool:
    with contextlib.suppress(OSError):
        return "Address already in use" in path.read_text(errors="replace")
    return False


def new_cluster_id() -> str:
    """A random cluster id in Kafka's format: a UUID as 22 URL-safe base64 characters.
    Never one starting with '-': StorageTool would read it as an option (Kafka's own
    Uuid.randomUuid() skips those for the same reason)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def plan_nodes(
    count: int,
    workdir: Path,
    requested_port: int | None,
    secure_listeners: Sequence[str],
    placement: Sequence[tuple[str, str]] | None,
) -> list[KafkaNode]:
    """Ports and folders for `count` nodes; fresh data folders, so storage is formatted
    anew. requested_port: the first node's client port (None: a free one, as every other
    port). secure_listeners: names of the secured listeners, a port each. placement:
    (host, netns) per node, or None for 127.0.0.1 in this namespace."""
    if requested_port is not None and port_in_use(requested_port):
        raise KafkaBrokerError(f"port {requested_port} is already in use")
    nodes = []
    for node_id in range(1, count + 1):
        port = requested_port if (node_id == 1 and requested_port is not None) else free_port()
        node_dir = workdir / f"node-{node_id}"
        shutil.rmtree(node_dir / "data", ignore_errors=True)
        node_dir.mkdir(parents=True, exist_ok=True)
        node = KafkaNode(node_id, port, free_port(), node_dir, {n: free_port() for n in secure_listeners})
        if placement is not None:
            node.host, node.netns = placement[node_id - 1]
        nodes.append(node)
    return nodes
