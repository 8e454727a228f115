"""Apache Kafka on demand, without Docker: the server jars from Maven Central, run as
child JVMs on loopback ports (KRaft, every node broker and controller at once).

    with KafkaBroker() as kafka:                      # one node
        kafka.create_topics({"requests": 6})
        ... consumer_config("kafka", kafka.bootstrap_servers, "group") ...
    with KafkaBroker(nodes=3) as cluster:             # RF 3, min.insync.replicas 2
        cluster.kill(cluster.leader_of("requests", 0)); ...; cluster.restart(node)

The same interface as EmbeddedBroker (consumers/brokers/embedded.py), so tests and the
`tidebatch broker --engine kafka` command can use either. The jars are fetched once with
`mvn dependency:copy-dependencies` (consumers/brokers/kafka_jars/pom.xml) into
~/.cache/tidebatch/kafka-<version>/libs, or $TIDEBATCH_KAFKA_HOME/libs.

Broker settings live in one table, SHARED_SETTINGS below: docker-compose.yml gives the
same values to its Apache Kafka as KAFKA_* variables, and tests/unit/test_kafka_dist.py
fails when the two disagree (docs/BROKERS.md).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata

from consumers import admin
from consumers.brokers.embedded import (
    HOST,
    BrokerError,
    LocalBroker,
    _accepts_connections,
    _pdeathsig_preexec,
    _terminate,
    free_port,
    port_in_use,
)
from consumers.brokers.kafka_security import (
    SECURE_LISTENER,
    Acl,
    KafkaSecurity,
    add_scram_user,
    allow,
    listener_protocols,
    server_settings,
)
from consumers.profiles import admin_config

# The pin. docker-compose.yml runs apache/kafka:<this> (checked by a unit test), so the
# tests and the compose stack run the same broker.
KAFKA_VERSION = "4.0.0"
POM = Path(__file__).resolve().parent / "kafka_jars" / "pom.xml"
# Full coordinates: Maven 3.8's default for the `dependency:` prefix is 2.8 (2014), and
# resolving a prefix needs remote metadata even when the plugin is already cached.
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
HOME_ENV = "TIDEBATCH_KAFKA_HOME"
_MARKER = ".complete"
# A clean KRaft shutdown (controlled shutdown, then the log flush) takes 1-3 s here.
STOP_TIMEOUT_S = 20.0
# stop(): how long the last nodes may go on once a majority has ended (_kill_quorumless).
QUORUM_GRACE_S = 2.0
_POLL_S = 0.05
_PORT_ATTEMPTS = 3
# Small heap (tests hold little data) and JIT/GC settings that favour start-up over
# peak throughput; measured in docs/BROKERS.md.
JVM_FLAGS: tuple[str, ...] = (
    "-Xms64m", "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
    "-Djava.awt.headless=true",
)
# slf4j-simple (see the pom): warnings and errors only, with times, to stderr → the log file.
_LOG_FLAGS: tuple[str, ...] = (
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
)

# ----------------------------------------------------------------------------- settings
# Every broker setting that docker-compose.yml also sets, with the same value there (as
# KAFKA_<KEY upper-cased, dots as underscores>). Change both or the unit test fails.
SHARED_SETTINGS: dict[str, str] = {
    # KRaft combined mode: each node is broker and controller, no ZooKeeper.
    "process.roles": "broker,controller",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    # One node: internal topics cannot have more replicas than brokers.
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    # A group's first join would otherwise wait 3 s for more members.
    "group.initial.rebalance.delay.ms": "0",
    # tidebatch creates topics with their final partition count (consumers/admin.py).
    "auto.create.topics.enable": "false",
}
# Set per node from ports and folders; compose has its own (container names, volumes),
# so these are never compared.
NODE_SPECIFIC: tuple[str, ...] = (
    "node.id",
    "listeners",
    "advertised.listeners",
    "listener.security.protocol.map",
    "controller.quorum.voters",
    "log.dirs",
)
# Only for these local brokers, on top of SHARED_SETTINGS: faster failure detection for
# the fault tests, and fewer internal partitions to create on a 2-core CI machine.
LOCAL_SETTINGS: dict[str, str] = {
    # A SIGKILLed node is fenced (and its partitions get new leaders) after this, not 9 s.
    # Not lower: at 3 s, heartbeats of 3-4 JVMs starting on 2 cores timed out, and a
    # node fenced right after start failed the first topic creation.
    "broker.session.timeout.ms": "6000",
    "broker.heartbeat.interval.ms": "1000",
    # The first consumer group creates __consumer_offsets: 50 partitions by default.
    "offsets.topic.num.partitions": "5",
    "transaction.state.log.num.partitions": "5",
    # KIP-848 groups (group.protocol=consumer) take their session timeout and heartbeat
    # from the broker: 45 s / 5 s by default, with minimums of the same. A SIGKILLed
    # member would keep its partitions for 45 s; 6 s / 1 s as for classic groups in
    # the tests. Production keeps Kafka's defaults (docs/OPERATIONS.md, "Rebalancing").
    "group.consumer.min.session.timeout.ms": "6000",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.min.heartbeat.interval.ms": "1000",
    "group.consumer.heartbeat.interval.ms": "1000",
    # Tests never produce much; small segments keep a node's disk use and restart short.
    "log.segment.bytes": str(16 * 1024 * 1024),
}
# With three nodes: durable by default, as production would be.
# A lone node has no other broker to fail over to: fencing it only stops everything.
# With the tests' 3-node cluster and a worker or three beside it on 2 cores, a single
# node missed its heartbeats for 6 s and fenced itself ("All brokers are currently
# fenced"): topic creation, metadata and group joins then failed until it recovered.
SINGLE_NODE_SETTINGS: dict[str, str] = {
    "broker.session.timeout.ms": "30000",
}

CLUSTER_SETTINGS: dict[str, str] = {
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
}


def server_properties(
    node_id: int,
    port: int,
    controller_port: int,
    voters: Mapping[int, int],
    log_dir: Path,
    secure: tuple[Mapping[str, int], KafkaSecurity] | None = None,
    hosts: Mapping[int, str] | None = None,
) -> dict[str, str]:
    """The full server.properties of one node. voters: {node id: controller port}.
    secure: ({listener name: port}, security) of the secured listeners
    (consumers/brokers/kafka_security.py: SASL_SSL, and MTLS and OAUTH when asked).
    hosts: {node id: the address it listens on and advertises}, HOST for those missing."""
    hosts = hosts or {}
    host = hosts.get(node_id, HOST)
    props = {**SHARED_SETTINGS, **LOCAL_SETTINGS}
    if len(voters) >= 3:
        props.update(CLUSTER_SETTINGS)
    else:
        props.update(SINGLE_NODE_SETTINGS)
    props.update({
        "node.id": str(node_id),
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        # A static quorum (as in docker-compose.yml): no dynamic-voter bootstrapping.
        "controller.quorum.voters": ",".join(
            f"{n}@{hosts.get(n, HOST)}:{p}" for n, p in sorted(voters.items())
        ),
        "log.dirs": str(log_dir),
    })
    if secure is not None:
        ports, security = secure
        for name, protocol in listener_protocols(security).items():
            listener = f"{name}://{host}:{ports[name]}"
            props["listeners"] += f",{listener}"
            props["advertised.listeners"] += f",{listener}"
            props["listener.security.protocol.map"] += f",{name}:{protocol}"
        props.update(server_settings(security))
    return props


def render_properties(props: Mapping[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in props.items())


# ----------------------------------------------------------------------------- jars
class KafkaBrokerError(BrokerError):
    """Apache Kafka cannot be fetched, started, or used."""


class _PortTaken(KafkaBrokerError):
    """A node could not bind a port: retried with other ports when we picked them."""


def kafka_home(version: str = KAFKA_VERSION) -> Path:
    """Folder holding libs/ for `version`: $TIDEBATCH_KAFKA_HOME, else the user cache."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "tidebatch" / f"kafka-{version}"


def _require(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise KafkaBrokerError(f"{tool} not found on PATH: {hint}")
    return path


def require_java() -> str:
    return _require("java", "Apache Kafka needs Java 17 or newer (apt-get install openjdk-17-jre-headless)")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def maven_error_line(output: str) -> str:
    """mvn's own last telling error line, without its boilerplate ("-> [Help 1]", ...)."""
    boilerplate = ("[Help", "-e switch", "-X switch", "full stack trace", "For more information", "Re-run Maven")
    lines = []
    for raw in _ANSI.sub("", output).splitlines():
        line = raw.strip()
        if not line.startswith("[ERROR]"):
            continue
        line = line.removeprefix("[ERROR]").strip().removesuffix("-> [Help 1]").strip()
        if line and not line.startswith("[Help") and not any(b in line for b in boilerplate):
            lines.append(line)
    if lines:
        return lines[-1]
    rest = [line.strip() for line in output.splitlines() if line.strip()]
    return rest[-1] if rest else "(no output)"


def ensure_jars(
    version: str = KAFKA_VERSION,
    home: Path | None = None,
    *,
    mvn_args: Sequence[str] = (),
) -> Path:
    """The libs/ folder with Apache Kafka `version`'s server jars; fetched with Maven the
    first time. Idempotent, and safe when processes race: one fetches under a file lock,
    the others wait and then find the marker. mvn_args: extra mvn flags (tests point
    them at an unreachable mirror)."""
    home = home or kafka_home(version)
    libs = home / "libs"
    if (home / _MARKER).is_file() and libs.is_dir():
        return libs
    mvn = _require("mvn", "Apache Kafka's jars are fetched with Maven (apt-get install maven)")
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / _MARKER).is_file() and libs.is_dir():
            return libs  # another process fetched them while we waited
        staging = Path(tempfile.mkdtemp(prefix="libs-", dir=home))
        cmd = [
            mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(POM),
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            f"-Dkafka.version={version}",
            f"-DoutputDirectory={staging}",
            "-DincludeScope=runtime",
            *mvn_args,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        jars = sorted(p.name for p in staging.glob("*.jar"))
        if proc.returncode != 0 or not any(j.startswith(f"kafka_2.13-{version}") for j in jars):
            shutil.rmtree(staging, ignore_errors=True)
            raise KafkaBrokerError(
                f"cannot fetch Apache Kafka {version} with Maven: "
                f"{maven_error_line(proc.stdout + proc.stderr)}"
            )
        shutil.rmtree(libs, ignore_errors=True)  # a half-fetched folder from a killed run
        staging.rename(libs)
        (home / _MARKER).write_text(f"kafka {version}\n" + "".join(f"{j}\n" for j in jars))
    return libs


# ----------------------------------------------------------------------------- nodes
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


def _log_says_port_taken(path: Path) -> bool:
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
                self._format(java)
                for node in self.nodes:
                    self._spawn(java, node)
                self._wait_ready(self.nodes, began + self.start_timeout)
                break
            except _PortTaken:
                self._stop_nodes(self.nodes)
                if attempt == attempts:
                    raise
            except BaseException:
                self._stop_nodes(self.nodes)
                raise
        self.start_seconds = time.monotonic() - began
        return self

    def stop(self) -> int | None:
        """SIGTERM every node at once (one by one, the last ones would wait for a quorum
        that is gone), SIGKILL those still running after stop_timeout, or QUORUM_GRACE_S
        after a majority has ended. Returns the first node's exit code (None if not
        running). Data is deleted, logs kept."""
        for node in self.nodes:
            if node.running:
                assert node.proc is not None
                with contextlib.suppress(ProcessLookupError):
                    node.proc.terminate()
        self._kill_quorumless(time.monotonic() + self.stop_timeout)
        codes = self._stop_nodes(self.nodes)
        # Nothing restarts from it (start() formats anew), and a session's brokers
        # would otherwise pile up data in pytest's kept temp dirs.
        for node in self.nodes:
            shutil.rmtree(node.dir / "data", ignore_errors=True)
        return codes[0] if codes else None

    def _kill_quorumless(self, deadline: float) -> None:
        """Wait for the nodes to end; once fewer than a majority of them are left, SIGKILL
        the rest after QUORUM_GRACE_S. A node still in its controlled shutdown then waits
        for a controller that is gone: a node restarted by `tidebatch broker node start`
        held `stop()` for the whole 20 s stop_timeout that way. Its data is deleted next."""
        majority = len(self.nodes) // 2 + 1
        lost_at: float | None = None
        while time.monotonic() < deadline:
            alive = [node for node in self.nodes if node.running]
            if not alive:
                return
            if len(alive) < majority:
                lost_at = lost_at if lost_at is not None else time.monotonic()
                if time.monotonic() - lost_at >= QUORUM_GRACE_S:
                    for node in alive:
                        assert node.proc is not None
                        with contextlib.suppress(ProcessLookupError):
                            node.proc.kill()
                    return
            time.sleep(_POLL_S)

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
        self._stop_nodes([target])  # reap, drop the finalizer
        self._spawn(require_java(), target)
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
            return target.node_id in self._metadata(timeout, target.address).brokers
        except KafkaBrokerError:
            return False

    def stop_node(self, node: KafkaNode | int) -> int | None:
        """SIGTERM one node and wait for its controlled shutdown (leaderships handed
        over first): one step of a rolling restart. Its exit code, None if not running."""
        codes = self._stop_nodes([self.node(node)])
        return codes[0] if codes else None

    def wait_in_sync(self, topics: Sequence[str] | None = None, timeout: float = 60.0) -> float:
        """Wait until every partition of `topics` (None: every topic, the internal ones
        too) has a leader and all its replicas in sync, in the metadata asked of each
        running node; returns the seconds it took. After a node rejoins, its replicas catch
        up from the leaders first: a rolling restart that goes on before that leaves
        partitions with one in-sync replica, below min.insync.replicas=2."""
        began = time.monotonic()
        deadline = began + timeout
        while True:
            lagging = [lag for node in self.nodes if node.running for lag in self._out_of_sync(node, topics, deadline)]
            if not lagging:
                return time.monotonic() - began
            if time.monotonic() >= deadline:
                raise KafkaBrokerError(f"partitions not in sync within {timeout:g} s: {lagging[:5]}")
            time.sleep(_POLL_S * 4)

    def _out_of_sync(self, node: KafkaNode, topics: Sequence[str] | None, deadline: float) -> list[str]:
        """What metadata asked of `node` shows not (yet) fully replicated."""
        try:
            metadata = self._metadata(max(deadline - time.monotonic(), 0.1), node.address)
        except KafkaBrokerError as exc:
            return [f"node {node.node_id}: {exc}"]
        # Whichever broker answered (a client may ask another it has learned of): ISR
        # changes go through the controller's log, and a node behind on it shows an
        # ISR still shrunk, never one grown too early.
        names = list(metadata.topics) if topics is None else list(topics)
        lagging = []
        for name in names:
            meta = metadata.topics.get(name)
            if meta is None or meta.error is not None:
                lagging.append(f"{name} unknown to node {node.node_id}")
                continue
            for pid, part in meta.partitions.items():
                if part.leader < 0 or sorted(part.isrs) != sorted(part.replicas):
                    lagging.append(f"{name}[{pid}] in sync {part.isrs} of {part.replicas}")
        return lagging

    def leader_of(self, topic: str, partition: int, timeout: float = 30.0) -> KafkaNode:
        """The node that leads `partition` of `topic` now. Waits up to `timeout` while
        there is none (an election after a kill) or metadata does not show it yet."""
        deadline = time.monotonic() + timeout
        while True:
            metadata = self._metadata(max(deadline - time.monotonic(), 0.1))
            meta = metadata.topics.get(topic)
            part = meta.partitions.get(partition) if meta is not None else None
            if part is not None and part.error is None and part.leader >= 0 and part.leader in metadata.brokers:
                return self.node(part.leader)
            if time.monotonic() >= deadline:
                state = "not in metadata" if part is None else f"leader {part.leader}, error {part.error}"
                raise KafkaBrokerError(f"no leader for {topic}[{partition}] within {timeout:g} s ({state})")
            time.sleep(_POLL_S * 4)

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
            self._wait_every_node_knows(created, deadline)
        return created

    # ---------------------------------------------------------------- internals
    def _wait_every_node_knows(self, topics: Mapping[str, int], deadline: float) -> None:
        """Each broker learns new topics from the metadata log on its own schedule: one
        answered, another may still say "unknown topic" for a while (seen in tests).
        Wait until every running node's own metadata shows them, all partitions led."""
        for node in self.nodes:
            if not node.running:
                continue
            while True:
                metadata = self._metadata(max(deadline - time.monotonic(), 0.1), node.address)
                # The client may ask another broker it has learned of: only this node's
                # own answer counts.
                if metadata.orig_broker_id == node.node_id and all(
                    name in metadata.topics
                    and len(metadata.topics[name].partitions) == count
                    and all(p.leader >= 0 for p in metadata.topics[name].partitions.values())
                    for name, count in topics.items()
                ):
                    break
                if time.monotonic() >= deadline:
                    raise KafkaBrokerError(f"node {node.node_id} does not show topics {sorted(topics)} in time")
                time.sleep(_POLL_S)

    def _metadata(self, timeout: float, bootstrap: str | None = None) -> ClusterMetadata:
        client = AdminClient(admin_config(bootstrap or self.bootstrap_servers))
        try:
            return client.list_topics(timeout=max(timeout, 0.1))
        except KafkaException as exc:
            raise KafkaBrokerError(f"cannot read metadata from Apache Kafka: {exc.args[0]}") from None

    def _plan_nodes(self) -> None:
        """Ports and folders for every node; fresh folders, so storage is formatted anew."""
        requested = self._requested_port
        if requested is not None and port_in_use(requested):
            raise KafkaBrokerError(f"port {requested} is already in use")
        self.nodes = []
        for node_id in range(1, self.node_count + 1):
            port = requested if (node_id == 1 and requested is not None) else free_port()
            node_dir = self.workdir / f"node-{node_id}"
            shutil.rmtree(node_dir / "data", ignore_errors=True)
            node_dir.mkdir(parents=True, exist_ok=True)
            names = listener_protocols(self.security) if self.security is not None else {}
            node = KafkaNode(node_id, port, free_port(), node_dir, {n: free_port() for n in names})
            if self._placement is not None:
                node.host, node.netns = self._placement[node_id - 1]
            self.nodes.append(node)
        voters = {node.node_id: node.controller_port for node in self.nodes}
        hosts = {node.node_id: node.host for node in self.nodes}
        for node in self.nodes:
            secure = (node.secure_ports, self.security) if self.security is not None else None
            props = server_properties(
                node.node_id, node.port, node.controller_port, voters, node.dir / "data", secure, hosts
            )
            props.update(self.settings)
            (node.dir / "server.properties").write_text(render_properties(props))

    def _java_cmd(self, java: str, main: str, *args: str) -> list[str]:
        assert self._libs is not None
        return [java, *JVM_FLAGS, *_LOG_FLAGS, "-cp", str(self._libs / "*"), main, *args]

    def _format(self, java: str) -> None:
        """StorageTool format on every node, in parallel (each is a ~1.5 s JVM)."""
        procs = []
        for node in self.nodes:
            cmd = self._java_cmd(
                java, "kafka.tools.StorageTool", "format",
                "--cluster-id", self.cluster_id, "--config", str(node.dir / "server.properties"),
            )
            procs.append(subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                preexec_fn=_pdeathsig_preexec(),
            ))
        failures = []
        for node, proc in zip(self.nodes, procs, strict=True):
            out, _ = proc.communicate()
            if proc.returncode != 0:
                failures.append(f"node {node.node_id}: {telling_line(out.decode(errors='replace'))}")
        if failures:
            raise KafkaBrokerError(f"formatting Kafka storage failed: {failures[0]}")

    def _spawn(self, java: str, node: KafkaNode) -> None:
        cmd = self._java_cmd(java, "kafka.Kafka", str(node.dir / "server.properties"))
        if node.netns is not None:
            # `ip netns exec` execs the command in place: the pid is the JVM's.
            cmd = ["ip", "netns", "exec", node.netns, *cmd]
        with open(node.log_path, "ab") as log_file:
            try:
                node.proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    # Own session: Ctrl-C reaches only us, and we stop the nodes in order.
                    start_new_session=True,
                    preexec_fn=_pdeathsig_preexec(),  # no orphan JVM if Python dies
                )
            except OSError as exc:
                raise KafkaBrokerError(f"cannot run {java}: {exc.strerror}") from None
        # atexit + GC safety net: the JVM is stopped even if stop() is never called.
        node.finalizer = weakref.finalize(self, _terminate, node.proc, self.stop_timeout)

    def _stop_nodes(self, nodes: Sequence[KafkaNode]) -> list[int]:
        """Exit codes of the nodes stopped now; nodes stopped before are skipped."""
        for node in nodes:
            if node.running:
                assert node.proc is not None
                with contextlib.suppress(ProcessLookupError):
                    node.proc.terminate()
        codes = []
        for node in nodes:
            if node.finalizer is not None:
                codes.append(node.finalizer())  # waits, SIGKILLs after stop_timeout, reaps
                node.finalizer = None
        return codes

    def _wait_ready(self, nodes: Sequence[KafkaNode], deadline: float) -> None:
        """Until each of `nodes` answers metadata on its own port and every one of them
        is listed as a broker (i.e. registered with the controller and unfenced)."""
        pending = list(nodes)
        while pending:
            for node in list(pending):
                assert node.proc is not None
                code = node.proc.poll()
                if code is not None:
                    if _log_says_port_taken(node.log_path):
                        raise _PortTaken(f"port {node.port} or {node.controller_port} is already in use")
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


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m consumers.brokers.kafka fetch`: fetch the pinned jars, print where they are
    (scripts/ensure_kafka.sh). One line on failure, exit 1."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m consumers.brokers.kafka")
    parser.add_argument("action", choices=["fetch"])
    parser.parse_args(argv)
    try:
        require_java()
        libs = ensure_jars()
    except KafkaBrokerError as exc:
        print(f"kafka: error: {exc}", file=sys.stderr)
        return 1
    print(f"kafka: Apache Kafka {KAFKA_VERSION} jars in {libs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
