"""Broker connections counted from librdkafka's statistics (consumers/broker_connections.py)."""

from consumers.broker_connections import BrokerConnections, ConnectionDelta


def doc(**brokers: tuple[str, int, int]) -> dict:
    out = {name: {"state": state, "connects": c, "disconnects": d, "source": "learned"}
           for name, (state, c, d) in brokers.items()}
    out["GroupCoordinator"] = {"state": "UP", "connects": 9, "disconnects": 9, "source": "internal"}
    return {"brokers": out}


def test_increments_and_brokers_up() -> None:
    conns = BrokerConnections()
    assert conns.update(doc(a=("UP", 1, 0), b=("UP", 1, 0), c=("UP", 1, 0))) == ConnectionDelta(3, 0, 3, 3)
    # Two nodes killed: their connections drop, librdkafka keeps trying.
    assert conns.update(doc(a=("UP", 1, 0), b=("CONNECT", 1, 1), c=("DOWN", 1, 1))) == ConnectionDelta(0, 2, 1, 3)
    assert conns.update(doc(a=("UP", 1, 0), b=("CONNECT", 1, 1), c=("DOWN", 1, 1))) == ConnectionDelta(0, 0, 1, 3)
    # Back: reconnected.
    assert conns.update(doc(a=("UP", 1, 0), b=("UP", 2, 1), c=("UP", 2, 1))) == ConnectionDelta(2, 0, 3, 3)


def test_a_broker_learned_again_never_counts_backwards() -> None:
    conns = BrokerConnections()
    conns.update(doc(a=("UP", 5, 4)))
    assert conns.update(doc(a=("UP", 1, 0))) == ConnectionDelta(0, 0, 1, 1)
    assert conns.update({}) == ConnectionDelta(0, 0, 0, 0)
