"""Per-broker states from librdkafka's refusals (consumers/broker_states.py): "no broker
answers" only when every known broker refused or librdkafka said all are down. A
fake time, no sleeps."""

from __future__ import annotations

from consumers.broker_states import STALE_S, BrokerStates, addresses

A, B, C = "10.0.0.1:9092", "10.0.0.2:9092", "10.0.0.3:9092"
BOOTSTRAP = f"{A},{B},{C}"


def test_addresses_drop_the_protocol_and_blanks() -> None:
    assert addresses(f"sasl_ssl://{A}, {B},") == [A, B]


def test_one_refusal_of_three_is_not_none_answering() -> None:
    states = BrokerStates(BOOTSTRAP)
    states.refused(B, 0.0)
    assert not states.none_answers(0.0)


def test_every_bootstrap_broker_refusing_is_none_answering() -> None:
    states = BrokerStates(BOOTSTRAP)
    for t, broker in enumerate((A, B, C)):
        states.refused(broker, float(t))
        assert states.none_answers(float(t)) == (broker == C)


def test_librdkafkas_all_brokers_down_is_none_answering_until_an_answer() -> None:
    states = BrokerStates(BOOTSTRAP)
    states.all_down(0.0)
    assert states.none_answers(1.0)
    states.answered(A, 2.0)
    assert not states.none_answers(2.0)


def test_others_answer_only_with_an_answer_since_their_last_refusal() -> None:
    states = BrokerStates(BOOTSTRAP)
    states.refused(B, 0.0)
    assert not states.others_answer(B, 0.0)  # nobody answered yet: not claimed
    states.answered(A, 1.0)
    assert states.others_answer(B, 1.0)
    states.refused(A, 2.0)
    assert not states.others_answer(B, 2.0)


def test_a_refusal_goes_stale_and_a_learned_broker_counts() -> None:
    states = BrokerStates(A)
    states.refused(A, 0.0)
    assert states.none_answers(0.0)
    assert not states.none_answers(STALE_S)  # not refused again: it may be back
    states.refused(B, STALE_S)  # a broker learned from metadata
    assert states.known == [A, B]
    assert not states.none_answers(STALE_S)  # A was not refused lately


def test_all_brokers_down_from_one_client_does_not_outweigh_an_answer() -> None:
    # Measured: a new producer that had tried only the dead broker of two said
    # "1/1 brokers are down" while the other answered the start-up check.
    states = BrokerStates(f"{A},{B}")
    states.answered(B, 0.0)
    states.refused(A, 1.0)
    states.all_down(1.0)
    assert not states.none_answers(1.0)
    states.refused(B, 2.0)  # now it is true
    assert states.none_answers(2.0)
