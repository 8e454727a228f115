"""The start-up check of a kafka-python worker runs through librdkafka
(pipeline/app/serve.py): it gets the librdkafka-named settings, and kafka-python's
`ssl_check_hostname: false` as librdkafka's way of saying the same."""

from __future__ import annotations

import pytest

from consumers.kafka_python_settings import librdkafka_check_settings


def test_kafka_pythons_own_keywords_stay_out() -> None:
    got = librdkafka_check_settings({"security.protocol": "SASL_SSL", "sasl.password": "p", "fetch_max_wait_ms": 5})
    assert got == {"security.protocol": "SASL_SSL", "sasl.password": "p"}


@pytest.mark.parametrize("off", [False, "false", "False"])
def test_no_hostname_check_in_kafka_python_is_none_in_librdkafka(off: object) -> None:
    got = librdkafka_check_settings({"ssl.ca.location": "/ca.pem", "ssl_check_hostname": off})
    assert got == {"ssl.ca.location": "/ca.pem", "ssl.endpoint.identification.algorithm": "none"}


def test_a_hostname_check_left_on_is_librdkafkas_default() -> None:
    assert librdkafka_check_settings({"ssl_check_hostname": True}) == {}
