"""What a local Apache Kafka's metadata says (consumers/brokers/kafka.py), read from one
node or any, and judged: partitions not fully replicated, topics a node does not show
yet, a partition's leader; and the waits until it says what a test needs (the wait_*
functions). The judging functions are pure, testable without a broker.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata

from consumers.brokers.kafka_fetch import KafkaBrokerError
from consumers.brokers.kafka_node import KafkaNode
from consumers.profiles import admin_config

_POLL_S = 0.05


def read_metadata(bootstrap: str, timeout: float) -> ClusterMetadata:
    client = AdminClient(admin_config(bootstrap))
    try:
        return client.list_topics(timeout=max(timeout, 0.1))
    except KafkaException as exc:
        raise KafkaBrokerError(f"cannot read metadata from Apache Kafka: {exc.args[0]}") from None


def out_of_sync(metadata: ClusterMetadata, node_id: int, topics: Sequence[str] | None) -> list[str]:
    """What `metadata` (asked of node `node_id`) shows not (yet) fully replicated among
    `topics` (None: every topic it lists, the internal ones too)."""
    # Whichever broker answered (a client may ask another it has learned of): ISR
    # changes go through the controller's log, and a node behind on it shows an
    # ISR still shrunk, never one grown too early.
    names = list(metadata.topics) if topics is None else list(topics)
    lagging = []
    for name in names:
        meta = metadata.topics.get(name)
        if meta is None or meta.error is not None:
            lagging.append(f"{name} unknown to node {node_id}")
            continue
        for pid, part in meta.partitions.items():
            if part.leader < 0 or sorted(part.isrs) != sorted(part.replicas):
                lagging.append(f"{name}[{pid}] in sync {part.isrs} of {part.replicas}")
    return lagging


def shows_topics(metadata: ClusterMetadata, node_id: int, topics: Mapping[str, int]) -> bool:
    """Does node `node_id`'s own answer list every one of `topics` ({name: partitions})
    with all its partitions, each led? The client may ask another broker it has learned
    of: only this node's own answer counts."""
    return metadata.orig_broker_id == node_id and all(
        name in metadata.topics
        and len(metadata.topics[name].partitions) == count
        and all(p.leader >= 0 for p in metadata.topics[name].partitions.values())
        for name, count in topics.items()
    )


def partition_leader(metadata: ClusterMetadata, topic: str, partition: int) -> tuple[int | None, str]:
    """The id of the registered broker that leads `partition` of `topic`, or None and
    what the metadata shows instead."""
    meta = metadata.topics.get(topic)
    part = meta.partitions.get(partition) if meta is not None else None
    if part is not None and part.error is None and part.leader >= 0 and part.leader in metadata.brokers:
        return part.leader, "led"
    return None, "not in metadata" if part is None else f"leader {part.leader}, error {part.error}"


# ----------------------------------------------------------------------------- waits
def wait_in_sync(nodes: Sequence[KafkaNode], topics: Sequence[str] | None, timeout: float) -> float:
    """Until every partition of `topics` (None: every topic) is led and fully in sync in
    the metadata asked of each running node of `nodes`; the seconds it took."""
    began = time.monotonic()
    deadline = began + timeout
    while True:
        lagging = [lag for node in nodes if node.running for lag in _node_out_of_sync(node, topics, deadline)]
        if not lagging:
            return time.monotonic() - began
        if time.monotonic() >= deadline:
            raise KafkaBrokerError(f"partitions not in sync within {timeout:g} s: {lagging[:5]}")
        time.sleep(_POLL_S * 4)


def _node_out_of_sync(node: KafkaNode, topics: Sequence[str] | None, deadline: float) -> list[str]:
    """What metadata asked of `node` shows not (yet) fully replicated."""
    try:
        metadata = read_metadata(node.address, max(deadline - time.monotonic(), 0.1))
    except KafkaBrokerError as exc:
        return [f"node {node.node_id}: {exc}"]
    return out_of_sync(metadata, node.node_id, topics)


def wait_for_leader(bootstrap: str, topic: str, partition: int, timeout: float) -> int:
    """The id of the node that leads `partition` of `topic`, waiting up to `timeout`
    while there is none (an election after a kill) or metadata does not show it yet."""
    deadline = time.monotonic() + timeout
    while True:
        metadata = read_metadata(bootstrap, max(deadline - time.monotonic(), 0.1))
        leader, state = partition_leader(metadata, topic, partition)
        if leader is not None:
            return leader
        if time.monotonic() >= deadline:
            raise KafkaBrokerError(f"no leader for {topic}[{partition}] within {timeout:g} s ({state})")
        time.sleep(_POLL_S * 4)


def wait_every_node_knows(nodes: Sequence[KafkaNode], topics: Mapping[str, int], deadline: float) -> None:
    """Each broker learns new topics from the metadata log on its own schedule: one
    answered, another may still say "unknown topic" for a while (seen in tests).
    Wait until every running node's own metadata shows them, all partitions led."""
    for node in nodes:
        if not node.running:
            continue
        while True:
            metadata = read_metadata(node.address, max(deadline - time.monotonic(), 0.1))
            if shows_topics(metadata, node.node_id, topics):
                break
            if time.monotonic() >= deadline:
                raise KafkaBrokerError(f"node {node.node_id} does not show topics {sorted(topics)} in time")
            time.sleep(_POLL_S)
