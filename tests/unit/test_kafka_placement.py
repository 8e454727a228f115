"""KafkaBroker's hosts/netns option (consumers/brokers/kafka.py), without a JVM: each
node listens on, advertises and is a voter at its own address, for the network-fault
tests that run each node in its own namespace (tests/integration/test_network_faults.py).
The default stays 127.0.0.1 (tests/unit/test_kafka_dist.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.brokers.kafka import KafkaBroker
from consumers.brokers.kafka_fetch import KafkaBrokerError
from consumers.brokers.kafka_node import KafkaNode
from consumers.brokers.kafka_security import KafkaSecurity
from consumers.brokers.kafka_settings import server_properties

HOSTS = {1: "10.231.7.2", 2: "10.231.7.3", 3: "10.231.7.4"}
VOTERS = {1: 9093, 2: 9193, 3: 9293}


def test_each_node_listens_and_advertises_on_its_host() -> None:
    props = server_properties(2, 9192, 9193, VOTERS, Path("/d"), hosts=HOSTS)
    assert props["listeners"] == "PLAINTEXT://10.231.7.3:9192,CONTROLLER://10.231.7.3:9193"
    assert props["advertised.listeners"] == "PLAINTEXT://10.231.7.3:9192"
    assert props["controller.quorum.voters"] == "1@10.231.7.2:9093,2@10.231.7.3:9193,3@10.231.7.4:9293"


def test_secured_listeners_use_the_host_too() -> None:
    security = KafkaSecurity(keystore=Path("/k.pem"), ca=Path("/ca.pem"))
    props = server_properties(1, 9092, 9093, {1: 9093}, Path("/d"), ({"SASL_SSL": 9094}, security),
                              hosts={1: "10.231.7.2"})
    assert "SASL_SSL://10.231.7.2:9094" in props["listeners"]
    assert "SASL_SSL://10.231.7.2:9094" in props["advertised.listeners"]


def test_a_node_address_is_its_host() -> None:
    assert KafkaNode(1, 9092, 9093, Path("/d")).address == "127.0.0.1:9092"
    assert KafkaNode(1, 9092, 9093, Path("/d"), host="10.231.7.2", netns="ns").address == "10.231.7.2:9092"


@pytest.mark.parametrize("hosts, netns", [
    (["10.231.7.2"], None),
    (None, ["ns1"]),
    (["10.231.7.2", "10.231.7.3"], ["ns1", "ns2"]),
])
def test_hosts_and_netns_come_together_one_per_node(hosts, netns) -> None:
    with pytest.raises(KafkaBrokerError, match="one each per node"):
        KafkaBroker(nodes=3 if hosts and len(hosts) == 2 else 1, hosts=hosts, netns=netns)
