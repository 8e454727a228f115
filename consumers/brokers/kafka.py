"""Apache Kafka on demand, without Docker: the server jars from Maven Central, run as
child JVMs on loopback ports (KRaft, every node broker and controller at once).

    with KafkaBroker() as kafka:                      # one node
        kafka.create_topics({"requests": 6})
        ... consumer_config("kafka", kafka.bootstrap_servers, "group") ...
    with KafkaBroker(nodes=3) as cluster:             # RF 3, min.insync.replicas 2
        cluster.kill(cluster.leader_of("requests", 0)); ...; cluster.restart(node)

The same interface as EmbeddedBroker (consumers/brokers/embedded.py), so tests and the
`tidebatch broker --engine kafka` command can use either. This module is the cluster's
lifecycle, faults and topics; its parts, each a module beside it:

- kafka_fetch.py: the pinned version and its jars, fetched once with Maven
  (`python -m consumers.brokers.kafka fetch`);
- kafka_settings.py: server.properties, and the settings shared with docker-compose.yml;
- kafka_node.py: one node's ports, folder and log, and how the nodes are laid out;
- kafka_process.py: the JVMs: formatting storage, starting and stopping nodes;
- kafka_metadata.py: reading the cluster's metadata and judging it (in sync, leaders).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from consumers import admin
from consumers.brokers.embedded import LocalBroker, _accepts_connections
from consumers.brokers.kafka_fetch import KAFKA_VERSION, KafkaBrokerError, ensure_jars, require_java
from consumers.brokers.kafka_metadata import (
    read_metadata,
    wait_every_node_knows,
    wait_for_leader,
    wait_in_sync,
)
from consumers.brokers.kafka_node import (
    KafkaNode,
    failure_line,
    log_says_port_taken,
    new_cluster_id,
    plan_nodes,
)
from consumers.brokers.kafka_process import (
    PortTaken,
    format_storage,
    kill_quorumless,
    spawn,
    stop_nodes,
    terminate,
)
from consumers.brokers.kafka_security import (
    SECURE_LISTENER,
    Acl,
    KafkaSecurity,
    add_scram_user,
    allow,
    listener_protocols,
)
from consumers.brokers.kafka_settings import write_properties

# A clean KRaft shutdown (controlled shutdown, then the log flush) takes 1-3 s here.
STOP_TIMEOUT_S = 20.0
# stop(): how long the last nodes may go on once a majority has ended (kill_quorumless).
QUORUM_GRACE_S = 2.0
_POLL_S = 0.05
_PORT_ATTEMPTS = 3


class KafkaBroker(LocalBroker):
    """A local Apache Kafka of `nodes` combined broker+controller JVMs (context manager).

    port: the first node's client port (None: free ports for everything). workdir:
    where each node keeps its properties, data and server.log (default: a new temp dir);
    stop() deletes the data and keeps the logs for post-mortems. start_timeout: seconds
    until every node answers a metadata request and is registered. security: adds a
    SASL_SSL listener with SCRAM users and ACLs, and the MTLS and OAUTH listeners if it
    says so (consumers/brokers/kafka_security.py). hosts and netns (one per node, both
    or neither): node i listens on and advertises hosts[i-1] and runs in network
    namespace netns[i-1] (`ip netns exec`); tests/integration/netns.py makes them, so
    that links can be cut. Default: 127.0.0.1 in this namespace.
    settings: more server.properties, winning over the defaults.
    """

    profile = "kafka"

    def __init__(
        self,
        nodes: int = 1,
        *,
        port: int | None = None,
        workdir: str | os.PathLike[str] | None = None,
        version: str = KAFKA_VERSION,
        start_timeout: float = 90.0,
        stop_timeout: float = STOP_TIMEOUT_S,
        security: KafkaSecurity | None = None,
        settings: Mapping[str, str] | None = None,
        hosts: Sequence[str] | None = None,
        netns: Sequence[str] | None = None,
    ) -> None:
        if nodes not in (1, 3):
            raise KafkaBrokerError(f"nodes must be 1 or 3, got {nodes}")
        if (hosts is not None or netns is not None) and not len(hosts or ()) == len(netns or ()) == nodes:
            raise KafkaBrokerError(f"hosts and netns: one each per node ({nodes}), or neither")
        if port is not None and not 0 < port < 65536:
            raise KafkaBrokerError(f"port must be 1-65535, got {port}")
        self.node_count = nodes
        self.version = version
        self._requested_port = port
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="tidebatch-kafka-"))
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.cluster_id = new_cluster_id()
        self.security = security
        # More server.properties, over the defaults: what one test's broker needs
        # (connections.max.reauth.ms for tests/integration/test_kafka_rotation.py).
        self.settings = dict(settings or {})
        # (host, netns) per node, or None: 127.0.0.1 in this namespace.
        self._placement = list(zip(hosts, netns, strict=True)) if hosts and netns else None
        self.nodes: list[KafkaNode] = []
        self._libs: Path | None = None
        self.start_seconds: float | None = None

    # ---------------------------------------------------------------- properties
    @property
    def bootstrap_servers(self) -> str:
        if not self.nodes:
            raise KafkaBrokerError("Apache Kafka is not started")
        return ",".join(node.address for node in self.nodes)

    @property
    def secure_bootstrap_servers(self) -> str:
        """The SASL_SSL listeners' addresses (the broker must be secured)."""
        return self.listener_bootstrap(SECURE_LISTENER)

    def listener_bootstrap(self, listener: str) -> str:
        """The addresses of the secured listener `listener` (SASL_SSL, MTLS, OAUTH)."""
        if self.security is None or listener not in listener_protocols(self.security):
            raise KafkaBrokerError(f"this Apache Kafka has no {listener} listener")
        if not self.nodes:
            raise KafkaBrokerError("Apache Kafka is not started")
        return ",".join(f"{node.host}:{node.secure_ports[listener]}" for node in self.nodes)

    def add_scram_user(self, username: str, password: str) -> None:
        """A SCRAM-SHA-512 user of the SASL_SSL listener."""
        add_scram_user(self.bootstrap_servers, username, password)

    def allow(self, principal: str, acls: Sequence[Acl]) -> None:
        """ALLOW ACLs for `principal` (e.g. "User:worker") on the SASL_SSL listener."""
        allow(self.bootstrap_servers, principal, acls)

    @property
    def running(self) -> bool:
        """True while every node runs (a killed node makes the cluster not `running`)."""
        return bool(self.nodes) and all(node.running for node in self.nodes)

    @property
    def replication_factor(self) -> int:
        return min(self.node_count, 3)

    @property
    def log_path(self) -> Path:
        """The first node's log (EmbeddedBroker has one log; each node has its own)."""
        return self.workdir / "node-1" / "server.log"

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"KafkaBroker({self.node_count} node(s), {state}, {self.workdir})"

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> KafkaBroker:
        """Fetch the jars if needed, format the nodes' storage, start them, and return once
        every node is registered and answers metadata requests."""
        if self.running:
            return self
        java = require_java()
        self._libs = ensure_jars(self.version)
        began = time.monotonic()
        attempts = 1 if self._requested_port is not None else _PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            self._plan_nodes()
            try:
                format_storage(java, self._libs, self.cluster_id, self.nodes)
                for node in self.nodes:
                    spawn(java, self._libs, node, self, self.stop_timeout)
                self._wait_ready(self.nodes, began + self.start_timeout)
                break
            except PortTaken:
                stop_nodes(self.nodes)
                if attempt == attempts:
                    raise
            except BaseException:
                stop_nodes(self.nodes)
                raise
        self.start_seconds = time.monotonic() - began
        return self

    def stop(self) -> int | None:
        """SIGTERM every node at once (one by one, the last ones would wait for a quorum
        that is gone), SIGKILL those still running after stop_timeout, or QUORUM_GRACE_S
        after a majority has ended. Returns the first node's exit code (None if not
        running). Data is deleted, logs kept."""
        terminate(self.nodes)
        kill_quorumless(self.nodes, time.monotonic() + self.stop_timeout, QUORUM_GRACE_S)
        codes = stop_nodes(self.nodes)
        # Nothing restarts from it (start() formats anew), and a session's brokers
        # would otherwise pile up data in pytest's kept temp dirs.
        for node in self.nodes:
            shutil.rmtree(node.dir / "data", ignore_errors=True)
        return codes[0] if codes else None

    # ---------------------------------------------------------------- faults
    def node(self, node: KafkaNode | int) -> KafkaNode:
        """A node by id (1-based) or the node itself."""
        node_id = node.node_id if isinstance(node, KafkaNode) else node
        for candidate in self.nodes:
            if candidate.node_id == node_id:
                return candidate
        raise KafkaBrokerError(f"no node {node_id} (nodes: {[n.node_id for n in self.nodes]})")

    def kill(self, node: KafkaNode | int) -> None:
        """SIGKILL one node: no controlled shutdown, as a crash or power loss."""
        target = self.node(node)
        if target.proc is not None and target.proc.poll() is None:
            target.proc.kill()
            target.proc.wait()

    def restart(self, node: KafkaNode | int) -> KafkaNode:
        """Start a stopped or killed node again with its old ports and data, and wait
        until it is registered again."""
        target = self.node(node)
        if target.running:
            return target
        self.start_node(target)
        self._wait_ready([target], time.monotonic() + self.start_timeout)
        return target

    def restart_many(self, nodes: Sequence[KafkaNode | int]) -> None:
        """restart() for several nodes at once: a cluster that lost its quorum registers
        no node until enough of them run again, so they must start together."""
        targets = [self.start_node(n) for n in nodes if not self.node(n).running]
        self._wait_ready(targets, time.monotonic() + self.start_timeout)

    def start_node(self, node: KafkaNode | int) -> KafkaNode:
        """Spawn a stopped or killed node again with its old ports and data, and return at
        once (node_ready says when it is registered; restart waits for it). Call it from
        the main thread, as start(): the JVM's parent-death signal is tied to the thread
        that spawns it (_pdeathsig_preexec)."""
        target = self.node(node)
        if target.running:
            return target
        if self._libs is None:
            raise KafkaBrokerError("Apache Kafka is not started")
        stop_nodes([target])  # reap, drop the finalizer
        spawn(require_java(), self._libs, target, self, self.stop_timeout)
        return target

    def signal_node(self, node: KafkaNode | int, signum: int) -> None:
        """Send `signum` to one node's JVM and return at once (exit_code tells when it
        ended): SIGTERM for a controlled shutdown, SIGKILL for a crash."""
        target = self.node(node)
        if target.running:
            assert target.proc is not None
            with contextlib.suppress(ProcessLookupError):
                target.proc.send_signal(signum)

    def exit_code(self, node: KafkaNode | int) -> int | None:
        """The node's JVM's return code once it has ended (negative: the signal), None
        while it runs or was never started."""
        target = self.node(node)
        return None if target.proc is None else target.proc.poll()

    def node_ready(self, node: KafkaNode | int, timeout: float = 2.0) -> bool:
        """One look: does the node answer metadata on its own port and list itself as a
        broker (registered with the controller, unfenced)?"""
        target = self.node(node)
        # A TCP probe first, so librdkafka does not log "Connection refused" noise.
        if not target.running or not _accepts_connections(target.port, target.host):
            return False
        try:
            return target.node_id in read_metadata(target.address, timeout).brokers
        except KafkaBrokerError:
            return False

    def stop_node(self, node: KafkaNode | int) -> int | None:
        """SIGTERM one node and wait for its controlled shutdown (leaderships handed
        over first): one step of a rolling restart. Its exit code, None if not running."""
        codes = stop_nodes([self.node(node)])
        return codes[0] if codes else None

    def wait_in_sync(self, topics: Sequence[str] | None = None, timeout: float = 60.0) -> float:
        """Wait until every partition of `topics` (None: every topic, the internal ones
        too) has a leader and all its replicas in sync, in the metadata asked of each
        running node; returns the seconds it took. After a node rejoins, its replicas catch
        up from the leaders first: a rolling restart that goes on before that leaves
        partitions with one in-sync replica, below min.insync.replicas=2."""
        return wait_in_sync(self.nodes, topics, timeout)

    def leader_of(self, topic: str, partition: int, timeout: float = 30.0) -> KafkaNode:
        """The node that leads `partition` of `topic` now. Waits up to `timeout` while
        there is none (an election after a kill) or metadata does not show it yet."""
        return self.node(wait_for_leader(self.bootstrap_servers, topic, partition, timeout))

    # ---------------------------------------------------------------- topics
    def create_topics(
        self,
        names_or_specs: admin.TopicSpecs,
        partitions: int = 1,
        timeout: float = 30.0,
        topic_config: Mapping[str, str] | None = None,
    ) -> dict[str, int]:
        """As EmbeddedBroker.create_topics; on three nodes with replication factor 3 and
        min.insync.replicas=2, so acks=all survives one node's loss."""
        deadline = time.monotonic() + timeout
        wanted = admin.normalize_topics(names_or_specs, partitions)
        config = {**({"min.insync.replicas": "2"} if self.replication_factor >= 3 else {}), **(topic_config or {})}
        created = admin.ensure_topics(
            self.bootstrap_servers, wanted, timeout=timeout,
            replication_factor=self.replication_factor, topic_config=config or None,
        )
        if len(self.nodes) > 1:
            wait_every_node_knows(self.nodes, created, deadline)
        return created

    # ---------------------------------------------------------------- internals
    def _plan_nodes(self) -> None:
        """Ports and folders for every node, and their server.properties; fresh folders,
        so storage is formatted anew."""
        listeners = list(listener_protocols(self.security)) if self.security is not None else []
        self.nodes = plan_nodes(self.node_count, self.workdir, self._requested_port, listeners, self._placement)
        write_properties(self.nodes, self.security, self.settings)

    def _wait_ready(self, nodes: Sequence[KafkaNode], deadline: float) -> None:
        """Until each of `nodes` answers metadata on its own port and every one of them
        is listed as a broker (i.e. registered with the controller and unfenced)."""
        pending = list(nodes)
        while pending:
            for node in list(pending):
                assert node.proc is not None
                code = node.proc.poll()
                if code is not None:
                    if log_says_port_taken(node.log_path):
                        raise PortTaken(f"port {node.port} or {node.controller_port} is already in use")
                    raise KafkaBrokerError(
                        f"Apache Kafka node {node.node_id} exited during start (code {code}): "
                        f"{failure_line(node.log_path)}; see {node.log_path}"
                    )
                if self.node_ready(node, min(2.0, max(deadline - time.monotonic(), 0.1))):
                    pending.remove(node)
            if not pending:
                return
            if time.monotonic() >= deadline:
                waiting = pending[0]
                raise KafkaBrokerError(
                    f"Apache Kafka node {waiting.node_id} did not become ready on {waiting.address} "
                    f"in time: {failure_line(waiting.log_path)}; see {waiting.log_path}"
                )
            time.sleep(_POLL_S)


if __name__ == "__main__":  # `python -m consumers.brokers.kafka fetch` (scripts/ensure_kafka.sh)
    from consumers.brokers.kafka_fetch import main

    raise SystemExit(main())
