"""Network faults, not just kills (issue 49, part 5): a `tidebatch run` worker and each
node of a 3-node Apache Kafka in their own network namespace, every pair joined by a
veth link (tests/integration/netns.py); links are cut with `ip link set down` for 20 s
under steady traffic, then healed:

- the worker from the whole cluster (its writes are held up: /readyz 503 "Kafka
  outage: ..." during, 200 after, the outage in a few log lines);
- the worker from the one broker leading an output partition (the cluster itself is
  healthy, so that leader stays and those results wait for the link; the rest flows);
- one broker, the same leader, from the other two (the worker and the test still reach
  it): the two keep the quorum, fence it and take its partitions over.

The last two are an outage for the worker only when its writes or commits all stop
(pipeline/delivery/kafka_progress.py), e.g. when the cut broker is its group coordinator:
there readiness is reported, not asserted, but an outage that began must be said and end.

Afterwards, as in test_cluster_faults.py (whose scenario helpers these tests reuse):
every request has an outcome, read by a reader in this (root) namespace whose links
are never cut; the worker never exits and exits 0 on SIGTERM. Figures go to the same
JSON lines file (docs/BROKERS.md, "Network faults"). The test process and the
producer stay in the root namespace, linked to every host.

`tc netem` (delay and loss) is tried too: kernels without sch_netem answer "Error:
Specified qdisc kind is unknown." and that test is skipped with tc's exact error.
Needs root and iproute2; without them every test here is skipped with the error.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.brokers.kafka import KafkaBroker
from tests.integration import opsutil
from tests.integration.conftest import TopicFactory, _topics_on
from tests.integration.netns import NetnsUnavailable, Network
from tests.integration.pipeline_helpers import register_broker
from tests.integration.test_cluster_faults import (
    Run,
    assert_outage_said,
    fault_run,
    finish,
    now_ms,
    outage_lines,
    traffic,
)

pytestmark = pytest.mark.integration

WORKER = "worker"
BROKERS = ("b1", "b2", "b3")
CUT_S = 20.0
# Traffic from 5 s before the cut to 10 s after the heal: what comes out after the heal
# is measured against a steady input, not a drained one.
TRAFFIC_S = 5 + CUT_S + 10


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    try:
        net = Network([WORKER, *BROKERS]).open()
    except NetnsUnavailable as exc:
        pytest.skip(f"network namespaces cannot be made here: {exc}")
    with net:
        yield net


@pytest.fixture(scope="module")
def ns_cluster(network: Network, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A 3-node Apache Kafka, node i in namespace BROKERS[i-1] on its address there."""
    with KafkaBroker(nodes=3, workdir=tmp_path_factory.mktemp("kafka-netns"),
                     hosts=[network.address(b) for b in BROKERS],
                     netns=[network.netns(b) for b in BROKERS]) as running:
        register_broker(running)
        yield running


@pytest.fixture
def ns_topic_factory(ns_cluster: KafkaBroker) -> Iterator[TopicFactory]:
    yield from _topics_on(ns_cluster)


@pytest.fixture(autouse=True)
def _healed(network: Network) -> Iterator[None]:
    """Every link up again after each test, even a failed one: the next starts whole."""
    yield
    network.heal_everything()


@pytest.fixture
def ns_run(network: Network, ns_cluster: KafkaBroker, ns_topic_factory: TopicFactory,
           unique_group_id: str, tmp_path: Path) -> Iterator[Run]:
    start = functools.partial(opsutil.start_worker_process, prefix=tuple(network.prefix(WORKER)),
                              metrics_host=network.address(WORKER))
    with fault_run(ns_cluster, ns_topic_factory, unique_group_id, tmp_path, start_worker=start) as run:
        yield run


def broker_of(cluster: KafkaBroker, topic: str, partition: int = 0) -> str:
    """The host name of the node leading `topic`[partition]."""
    return BROKERS[cluster.leader_of(topic, partition).node_id - 1]


def cut_for(run: Run, network: Network, pairs: list[tuple[str, str]], seed: int) -> tuple[int, int]:
    """Cut `pairs` for CUT_S under traffic (5 s in), heal; (cut, heal) times in ms."""
    began = time.monotonic()
    traffic(run, seed=seed, seconds=TRAFFIC_S)
    # Work in flight when the link goes: a worker with nothing waiting is in no outage
    # (pipeline/delivery/kafka_progress.py); once, 5 s into the traffic, the worker had
    # logged nothing of its work and no outage followed the cut (most likely nothing
    # of it was in flight yet).
    opsutil.wait_for(lambda: run.alive() or run.collector.seen() > 0, 60, "the first outcome")
    run.pause(max(0.0, began + 5 - time.monotonic()))
    cut = now_ms()
    for a, b in pairs:
        network.cut(a, b)
    try:
        run.pause(CUT_S)
    finally:
        for a, b in pairs:
            network.heal(a, b)
    return cut, now_ms()


def outage_over(run: Run) -> None:
    """Wait for the worker's "Kafka outage over after N s" line, so the report has it."""
    opsutil.wait_for(lambda: run.alive() or any("outage over after" in line for line in outage_lines(run)),
                     120, "the worker to log the end of the outage")


def test_worker_cut_from_cluster_for_20_s(network: Network, ns_run: Run) -> None:
    cut, healed = cut_for(ns_run, network, [(WORKER, b) for b in BROKERS], seed=31)
    outage_over(ns_run)
    finish(ns_run, "netns_worker_cut_from_cluster_20s", cut, outage=True, healed_after_ms=healed - cut,
           outage_lines=[line[:240] for line in outage_lines(ns_run)])
    assert_outage_said(ns_run)


def test_worker_cut_from_one_broker_for_20_s(network: Network, ns_cluster: KafkaBroker, ns_run: Run) -> None:
    # The leader of an output partition: the cluster stays healthy, so it stays leader
    # and the worker cannot write those results until the link is back. Its other
    # deliveries and commits go on, which is no outage (pipeline/delivery/kafka_progress.py:
    # a channel is stalled only with no success at all), unless the broker is also its
    # group coordinator (commits wait): readiness reported, not asserted; an outage,
    # if one began, must be said in a few lines and end.
    victim = broker_of(ns_cluster, ns_run.topics.output)
    cut, healed = cut_for(ns_run, network, [(WORKER, victim)], seed=32)
    began = bool(outage_lines(ns_run))
    if began:
        outage_over(ns_run)
    finish(ns_run, "netns_worker_cut_from_one_broker_20s", cut, outage=None, healed_after_ms=healed - cut,
           broker=victim, outage_lines=[line[:240] for line in outage_lines(ns_run)])
    if began:
        assert_outage_said(ns_run)


def test_broker_cut_from_the_others_for_20_s(network: Network, ns_cluster: KafkaBroker, ns_run: Run) -> None:
    victim = broker_of(ns_cluster, ns_run.topics.output)
    cut, healed = cut_for(ns_run, network, [(victim, b) for b in BROKERS if b != victim], seed=33)
    ns_cluster.wait_in_sync()
    # The two keep the quorum and take its partitions over once they fence it (6 s,
    # broker.session.timeout.ms); whether the worker's writes or commits wait 10 s
    # meanwhile depends on where its group coordinator was: reported, not asserted.
    if outage_lines(ns_run):
        outage_over(ns_run)
    finish(ns_run, "netns_broker_cut_from_others_20s", cut, outage=None, healed_after_ms=healed - cut,
           broker=victim, outage_lines=[line[:240] for line in outage_lines(ns_run)])


def test_worker_links_degraded_for_20_s(network: Network, ns_run: Run) -> None:
    """netem delay 100 ms and 10 % loss on the worker's links to every broker."""
    error = network.netem_error()
    if error is not None:
        pytest.skip(f"tc netem unavailable in this kernel: {error}")
    traffic(ns_run, seed=21, seconds=TRAFFIC_S)
    ns_run.pause(5)
    fault = now_ms()
    for b in BROKERS:
        network.degrade(WORKER, b, delay_ms=100, loss_pct=10)
    try:
        ns_run.pause(CUT_S)
    finally:
        for b in BROKERS:
            network.restore(WORKER, b)
    finish(ns_run, "netns_worker_degraded_20s", fault, outage=None, healed_after_ms=now_ms() - fault)


def test_netns_helper_cleans_up() -> None:
    """close() leaves no namespace nor link behind, and a cut is a cut."""
    try:
        net = Network(["a", "b"]).open()
    except NetnsUnavailable as exc:
        pytest.skip(f"network namespaces cannot be made here: {exc}")
    with net:
        names = [net.netns("a"), net.netns("b")]
        server = net.popen("b", [sys.executable, "-c", (
            "import socket,time;s=socket.socket();"
            f"s.bind(('{net.address('b')}', 9099));s.listen();time.sleep(600)")])
        opsutil.wait_for(lambda: _connects(net, "root", net.address("b")), 30, "b to listen")
        assert _connects(net, "a", net.address("b"))
        net.cut("a", "b")
        assert not _connects(net, "a", net.address("b"))
        assert _connects(net, "root", net.address("b"))  # other links stay up
        net.heal("a", "b")
        assert _connects(net, "a", net.address("b"))
    assert server.poll() is not None
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in names), listed
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"tb{net.run_id}" not in links


def _connects(net: Network, host: str, address: str) -> bool:
    """A TCP connection from `host` to `address`:9099 succeeds within 1 s."""
    probe = (f"import socket;socket.create_connection(('{address}', 9099), timeout=1).close()")
    return subprocess.run([*net.prefix(host), sys.executable, "-c", probe], capture_output=True).returncode == 0

