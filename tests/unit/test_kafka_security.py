"""The secured listeners' server.properties (consumers/brokers/kafka_security.py),
without starting a broker; tests/integration/test_kafka_mtls_oauth.py logs in on them."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.brokers.kafka_security import (
    KafkaSecurity,
    listener_protocols,
    mtls_client_settings,
    oauthbearer_client_settings,
)
from consumers.brokers.kafka_settings import server_properties

PORTS = {"SASL_SSL": 9094, "MTLS": 9095, "OAUTH": 9096}


def test_scram_alone_is_one_secured_listener() -> None:
    security = KafkaSecurity(Path("/ks.pem"), Path("/ca.pem"))
    props = server_properties(1, 9092, 9093, {1: 9093}, Path("/d"), ({"SASL_SSL": 9094}, security))
    assert props["listeners"].endswith(",SASL_SSL://127.0.0.1:9094")
    assert not [k for k in props if k.startswith(("listener.name.mtls.", "listener.name.oauth."))]


def test_mtls_and_oauthbearer_listeners() -> None:
    security = KafkaSecurity(Path("/ks.pem"), Path("/ca.pem"), client_ca=Path("/clients.pem"), oauthbearer=True)
    assert listener_protocols(security) == {"SASL_SSL": "SASL_SSL", "MTLS": "SSL", "OAUTH": "SASL_SSL"}
    props = server_properties(1, 9092, 9093, {1: 9093}, Path("/d"), (PORTS, security))
    assert props["listeners"].endswith(",SASL_SSL://127.0.0.1:9094,MTLS://127.0.0.1:9095,OAUTH://127.0.0.1:9096")
    assert props["advertised.listeners"].endswith(",MTLS://127.0.0.1:9095,OAUTH://127.0.0.1:9096")
    assert "MTLS:SSL" in props["listener.security.protocol.map"].split(",")
    assert props["listener.name.mtls.ssl.client.auth"] == "required"
    assert props["listener.name.mtls.ssl.truststore.location"] == "/clients.pem"
    assert props["listener.name.mtls.ssl.principal.mapping.rules"] == "DEFAULT"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"  # SASL_SSL keeps SCRAM alone
    assert props["listener.name.oauth.sasl.enabled.mechanisms"] == "OAUTHBEARER"
    assert 'unsecuredValidatorRequiredScope="kafka"' in props["listener.name.oauth.oauthbearer.sasl.jaas.config"]


def test_client_settings() -> None:
    inline = mtls_client_settings("/c.crt", "/ca.pem", key_pem="-----BEGIN PRIVATE KEY-----\n...")
    assert inline["security.protocol"] == "SSL" and "ssl.key.location" not in inline
    assert mtls_client_settings("/c.crt", "/ca.pem", key_location="/c.key")["ssl.key.location"] == "/c.key"
    with pytest.raises(ValueError):
        mtls_client_settings("/c.crt", "/ca.pem")
    token = oauthbearer_client_settings("worker", "/ca.pem")
    assert token["sasl.oauthbearer.config"] == "principal=worker scope=kafka"
    assert token["enable.sasl.oauthbearer.unsecure.jwt"] == "true"


def test_kafka_python_cannot_take_a_token_or_an_inline_key() -> None:
    # kafka-python logs in with OAUTHBEARER only through a token-provider object, which
    # no setting can name; and it reads keys from files only (ssl_keyfile).
    from consumers.kafka_python_settings import kafka_python_settings
    from pipeline.errors import UserError

    with pytest.raises(UserError, match=r"^Kafka setting (enable\.)?sasl\.oauthbearer\.\S+ is not supported by client kafka-python"):
        kafka_python_settings(oauthbearer_client_settings("worker", "/ca.pem"))
    with pytest.raises(UserError, match=r"^Kafka setting ssl\.key\.pem is not supported by client kafka-python"):
        kafka_python_settings(mtls_client_settings("/c.crt", "/ca.pem", key_pem="..."))
    by_file = kafka_python_settings(mtls_client_settings("/c.crt", "/ca.pem", key_location="/c.key"))
    assert (by_file["ssl_certfile"], by_file["ssl_keyfile"], by_file["security_protocol"]) == ("/c.crt", "/c.key", "SSL")
