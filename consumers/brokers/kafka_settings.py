"""Apache Kafka's server.properties for the local brokers (consumers/brokers/kafka.py):
the settings shared with docker-compose.yml, those only for local brokers, one node's
full properties from its ports and folders, and the file written from them.

Broker settings live in one table, SHARED_SETTINGS below: docker-compose.yml gives the
same values to its Apache Kafka as KAFKA_* variables, and tests/unit/test_kafka_dist.py
fails when the two disagree (docs/BROKERS.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from consumers.brokers.embedded import HOST
from consumers.brokers.kafka_node import KafkaNode
from consumers.brokers.kafka_security import KafkaSecurity, listener_protocols, server_settings

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


def write_properties(
    nodes: Sequence[KafkaNode], security: KafkaSecurity | None, settings: Mapping[str, str]
) -> None:
    """Each node's server.properties in its folder, its data in data/ there; `settings`
    win over the defaults."""
    voters = {node.node_id: node.controller_port for node in nodes}
    hosts = {node.node_id: node.host for node in nodes}
    for node in nodes:
        secure = (node.secure_ports, security) if security is not None else None
        props = server_properties(
            node.node_id, node.port, node.controller_port, voters, node.dir / "data", secure, hosts
        )
        props.update(settings)
        (node.dir / "server.properties").write_text(render_properties(props))
