"""The `kafka:` block → Faust settings (pipeline/faust/kafka_settings.py): each mapping,
the one-line refusals naming the key, secrets resolved and never shown."""

from __future__ import annotations

import logging
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from pipeline.config import KafkaOverrides
from pipeline.errors import UserError

faust = pytest.importorskip("faust", reason="faust-streaming is not installed (the [faust] extra)")

from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth  # noqa: E402

from pipeline.faust.app import make_app  # noqa: E402
from pipeline.faust.kafka_settings import describe, faust_kafka_settings, load_kafka_block  # noqa: E402

SECRET = "s3cr3t-Faust-Zq9vX"
KEY_PASSWORD = "k3y-pa55-Wq7"
SCRAM = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
         "sasl.username": "tidebatch", "sasl.password": SECRET}


def translate(common: dict | None = None, environ: dict | None = None, **roles: dict) -> dict:
    return faust_kafka_settings(KafkaOverrides(common=common or {}, **roles), environ or {})


def refusal(common: dict | None = None, **roles: dict) -> str:
    with pytest.raises(UserError) as err:
        translate(common, **roles)
    text = str(err.value)
    assert "\n" not in text, "one line"
    assert SECRET not in text and KEY_PASSWORD not in text
    return text


def aiokafka_auth(settings: dict) -> dict:
    """What Faust hands aiokafka's consumer and producer (credentials_to_aiokafka_auth)."""
    return credentials_to_aiokafka_auth(settings.get("broker_credentials"), None)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A self-signed certificate (also the CA) and its key, encrypted with KEY_PASSWORD."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"), "-days", "2", "-subj", "/CN=localhost",
         "-passout", f"pass:{KEY_PASSWORD}"],
        check=True, capture_output=True,
    )
    return {"ca": str(d / "cert.pem"), "cert": str(d / "cert.pem"), "key": str(d / "key.pem")}


# ------------------------------------------------------------------ security protocols
def test_plaintext_and_empty_block_leave_faust_alone() -> None:
    assert translate() == {}
    assert translate({"security.protocol": "plaintext"}) == {}
    assert aiokafka_auth({}) == {"security_protocol": "PLAINTEXT"}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "scram-sha-512"])
def test_sasl_ssl_with_user_and_password(mechanism: str) -> None:
    got = translate({**SCRAM, "sasl.mechanism": mechanism})
    creds = got["broker_credentials"]
    assert isinstance(creds, faust.SASLCredentials)
    auth = aiokafka_auth(got)
    assert auth["security_protocol"] == "SASL_SSL"
    assert auth["sasl_mechanism"] == mechanism.upper()
    assert (auth["sasl_plain_username"], auth["sasl_plain_password"]) == ("tidebatch", SECRET)
    context = auth["ssl_context"]
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname  # system CAs


def test_sasl_plaintext_has_no_tls_and_takes_the_older_alias() -> None:
    got = translate({"security.protocol": "sasl_plaintext", "sasl.mechanisms": "PLAIN",
                     "sasl.username": "u", "sasl.password": SECRET})
    auth = aiokafka_auth(got)
    assert auth["security_protocol"] == "SASL_PLAINTEXT"
    assert auth["sasl_mechanism"] == "PLAIN"
    assert auth["ssl_context"] is None


def test_gssapi_is_librdkafkas_default_mechanism() -> None:
    got = translate({"security.protocol": "SASL_PLAINTEXT", "sasl.kerberos.service.name": "kafka-svc"})
    creds = got["broker_credentials"]
    assert isinstance(creds, faust.GSSAPICredentials)
    assert aiokafka_auth(got)["sasl_kerberos_service_name"] == "kafka-svc"
    assert aiokafka_auth(got)["sasl_mechanism"] == "GSSAPI"


def test_ssl_with_private_ca_and_client_certificate(tls_files: dict[str, str]) -> None:
    got = translate({
        "security.protocol": "SSL", "ssl.ca.location": tls_files["ca"],
        "ssl.certificate.location": tls_files["cert"], "ssl.key.location": tls_files["key"],
        "ssl.key.password": KEY_PASSWORD,
    })
    assert isinstance(got["broker_credentials"], faust.SSLCredentials)
    auth = aiokafka_auth(got)
    assert auth["security_protocol"] == "SSL"
    context = auth["ssl_context"]
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    assert any(c["subject"] == ((("commonName", "localhost"),),) for c in context.get_ca_certs())


def test_ca_as_inline_pem_and_as_key_password_from_a_file(tls_files: dict[str, str], tmp_path: Path) -> None:
    pw = tmp_path / "key-password"
    pw.write_text(KEY_PASSWORD + "\n")
    got = translate({
        "security.protocol": "SSL", "ssl.ca.pem": Path(tls_files["ca"]).read_text(),
        "ssl.certificate.location": tls_files["cert"], "ssl.key.location": tls_files["key"],
        "ssl.key.password": f"@file:{pw}",
    })
    assert len(aiokafka_auth(got)["ssl_context"].get_ca_certs()) == 1


def test_hostname_and_certificate_checks_can_be_switched_off() -> None:
    base = {"security.protocol": "SSL"}
    context = aiokafka_auth(translate({**base, "ssl.endpoint.identification.algorithm": "none"}))["ssl_context"]
    assert not context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    context = aiokafka_auth(translate({**base, "enable.ssl.certificate.verification": "false"}))["ssl_context"]
    assert not context.check_hostname and context.verify_mode == ssl.CERT_NONE


def test_wrong_key_password_is_one_line_without_it(tls_files: dict[str, str]) -> None:
    text = refusal({"security.protocol": "SSL", "ssl.certificate.location": tls_files["cert"],
                    "ssl.key.location": tls_files["key"], "ssl.key.password": SECRET})
    assert text.startswith("Kafka TLS settings (ssl.*)")


def test_missing_files_are_named(tmp_path: Path) -> None:
    gone = tmp_path / "nope.pem"
    assert refusal({"security.protocol": "SSL", "ssl.ca.location": str(gone)}) == (
        f"Kafka setting ssl.ca.location: {gone} does not exist")
    assert "ssl.key.location needs ssl.certificate.location" in refusal(
        {"security.protocol": "SSL", "ssl.key.location": str(gone)})


# -------------------------------------------------------------- client id and tunables
def test_client_id_and_tunables_reach_their_faust_settings() -> None:
    got = translate(
        {"client.id": "scorer", "metadata.max.age.ms": 30000},
        consumer={"session.timeout.ms": 9000, "heartbeat.interval.ms": "1500", "max.poll.interval.ms": 600000,
                  "auto.offset.reset": "Earliest", "group.instance.id": "pod-1",
                  "max.partition.fetch.bytes": 2097152, "check.crcs": "false", "connections.max.idle.ms": 1000},
        producer={"acks": "all", "linger.ms": 20, "compression.type": "ZSTD", "batch.size": 65536,
                  "message.max.bytes": 4194304, "request.timeout.ms": 45000},
    )
    assert got == {
        "broker_client_id": "scorer",
        "consumer_metadata_max_age_ms": 30000, "producer_metadata_max_age_ms": 30000,
        "broker_session_timeout": 9.0, "broker_heartbeat_interval": 1.5, "broker_max_poll_interval": 600.0,
        "consumer_auto_offset_reset": "earliest", "consumer_group_instance_id": "pod-1",
        "consumer_max_fetch_size": 2097152, "broker_check_crcs": False, "consumer_connections_max_idle_ms": 1000,
        "producer_acks": -1, "producer_linger": 0.02, "producer_compression_type": "zstd",
        "producer_max_batch_size": 65536, "producer_max_request_size": 4194304, "producer_request_timeout": 45.0,
    }
    assert translate(producer={"request.required.acks": 1}) == {"producer_acks": 1}


def test_a_property_of_the_other_client_is_skipped_as_librdkafka_does() -> None:
    # common reaches both clients: each takes its own (librdkafka ignores the other's).
    assert translate({"session.timeout.ms": 10000, "linger.ms": 5}) == {
        "broker_session_timeout": 10.0, "producer_linger": 0.005}


def test_not_a_number() -> None:
    assert refusal(consumer={"session.timeout.ms": "soon"}) == (
        "Kafka setting session.timeout.ms: expected a number, got 'soon'")


# ------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(("common", "roles", "named"), [
    ({"fetch.wait.max.ms": 5}, {}, "fetch.wait.max.ms"),
    ({"enable.idempotence": True}, {}, "enable.idempotence"),
    ({"fetch_max_wait_ms": 5}, {}, "fetch_max_wait_ms"),  # a kafka-python kwarg is not Faust's
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}, {}, "sasl.mechanism"),
    ({"security.protocol": "QUIC"}, {}, "security.protocol"),
    ({"ssl.ca.location": "/etc/ca.pem"}, {}, "ssl.ca.location"),  # TLS settings without TLS
    ({**SCRAM, "security.protocol": "SSL"}, {}, "sasl.mechanism"),  # SASL settings without SASL
    ({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "dns"}, {},
     "ssl.endpoint.identification.algorithm"),
    ({**SCRAM, "sasl.kerberos.service.name": "kafka"}, {}, "sasl.kerberos.service.name"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.username": "u"}, {}, "sasl.username"),  # GSSAPI
    (SCRAM, {"producer": {"sasl.username": "writer"}}, "sasl.username"),  # one identity per app
    ({"client.id": "a"}, {"admin": {"client.id": "b"}}, "client.id"),
    ({}, {"admin": {"request.timeout.ms": 1000}}, "request.timeout.ms"),
])
def test_what_faust_cannot_honour_is_refused_by_name(common: dict, roles: dict, named: str) -> None:
    text = refusal(common, **roles)
    assert f"Kafka setting {named} " in text, text


def test_sasl_user_mechanism_needs_both_credentials() -> None:
    no_user = {k: v for k, v in SCRAM.items() if k != "sasl.username"}
    assert refusal(no_user) == "Kafka setting sasl.username is missing: sasl.mechanism SCRAM-SHA-512 needs it"


def test_admin_may_repeat_what_the_producer_gets() -> None:
    got = translate({"client.id": "x"}, producer={"request.timeout.ms": 1000}, admin={"request.timeout.ms": 1000})
    assert got == {"broker_client_id": "x", "producer_request_timeout": 1.0}


# -------------------------------------------------------------------------- secrets
def test_password_from_env_and_from_file(tmp_path: Path) -> None:
    env = translate({**SCRAM, "sasl.password": "${KAFKA_PW}"}, environ={"KAFKA_PW": SECRET})
    assert aiokafka_auth(env)["sasl_plain_password"] == SECRET
    path = tmp_path / "pw"
    path.write_text(SECRET + "\n")
    from_file = translate({**SCRAM, "sasl.password": f"@file:{path}"})
    assert aiokafka_auth(from_file)["sasl_plain_password"] == SECRET
    text = refusal({**SCRAM, "sasl.password": "${UNSET_PW}"})
    assert text == "Kafka setting sasl.password: environment variable UNSET_PW is not set"


def test_no_secret_in_logs_descriptions_or_reprs(caplog: pytest.LogCaptureFixture, tls_files: dict) -> None:
    block = KafkaOverrides(common={**SCRAM, "sasl.password": "${KAFKA_PW}", "ssl.ca.location": tls_files["ca"],
                                   "ssl.certificate.location": tls_files["cert"],
                                   "ssl.key.location": tls_files["key"], "ssl.key.password": KEY_PASSWORD,
                                   "client.id": "scorer"})
    caplog.set_level(logging.DEBUG)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KAFKA_PW", SECRET)
        app = make_app("tidebatch-secret-test", "kafka://127.0.0.1:1", kafka=block)
        settings = faust_kafka_settings(block)
    assert app.conf.broker_client_id == "scorer"
    assert app.conf.broker_credentials.password == SECRET  # reached Faust ...
    line = describe(settings)  # what the app logs when it starts
    shown = caplog.text + repr(line) + repr(settings) + repr(block) + repr(app.conf.broker_credentials)
    for secret in (SECRET, KEY_PASSWORD):  # ... and nothing printed it
        assert secret not in shown
    assert line["broker_credentials"] == "SASLCredentials(SCRAM-SHA-512, user ***)"


# -------------------------------------------------------------- where the block comes from
def test_block_from_a_worker_config_file_and_the_workers_variables(tmp_path: Path) -> None:
    config = tmp_path / "worker.yaml"
    config.write_text(
        "pipeline: ctr\nkafka:\n  common:\n    security.protocol: SASL_SSL\n"
        "    sasl.mechanism: PLAIN\n    sasl.username: from-file\n  consumer:\n    session.timeout.ms: 7000\n"
    )
    env = {
        "TIDEBATCH_KAFKA__COMMON__SASL_USERNAME": "from-env",
        "TIDEBATCH_KAFKA__COMMON__SASL_PASSWORD": "${KAFKA_PW}",
        "TIDEBATCH_PIPELINE": "not-a-pipeline",  # the worker's, not looked at
        "TIDEBATCH_FAUST_APP_ID": "x",
        "KAFKA_PW": SECRET,
    }
    block = load_kafka_block(config, env)
    assert SECRET not in repr(block)
    auth = aiokafka_auth(faust_kafka_settings(block, env))
    assert (auth["sasl_mechanism"], auth["sasl_plain_username"], auth["sasl_plain_password"]) == (
        "PLAIN", "from-env", SECRET)
    assert load_kafka_block(None, {}).common == {}


def test_block_settings_sit_between_the_profile_and_explicit_settings() -> None:
    block = KafkaOverrides(consumer={"session.timeout.ms": 9000, "heartbeat.interval.ms": 2000})
    app = make_app("tidebatch-order-test", "kafka://127.0.0.1:1", profile="embedded", kafka=block,
                   broker_heartbeat_interval=0.5)
    assert app.conf.broker_session_timeout == 9.0  # the block wins over the embedded profile's 6 s
    assert app.conf.broker_heartbeat_interval == 0.5  # explicit settings win over the block


# ------------------------------------------------------------------- the example app
APP = Path(__file__).resolve().parents[2] / "examples" / "faust_ctr" / "app.py"


def test_the_example_app_takes_the_block_from_its_config_and_the_workers_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import runpy

    config = tmp_path / "worker.yaml"
    config.write_text("kafka:\n  common:\n    client.id: faust-scorer\n")
    monkeypatch.setenv("TIDEBATCH_FAUST_CONFIG", str(config))
    for key, value in {**SCRAM, "sasl.password": "${KAFKA_PW}"}.items():
        monkeypatch.setenv("TIDEBATCH_KAFKA__COMMON__" + key.replace(".", "_").upper(), value)
    monkeypatch.setenv("KAFKA_PW", SECRET)
    caplog.set_level(logging.DEBUG)
    app = runpy.run_path(str(APP))["app"]
    assert app.conf.broker_client_id == "faust-scorer"
    assert aiokafka_auth({"broker_credentials": app.conf.broker_credentials})["sasl_plain_password"] == SECRET
    assert SECRET not in caplog.text

    monkeypatch.setenv("TIDEBATCH_KAFKA__CONSUMER__FETCH_WAIT_MAX_MS", "5")
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(APP))
    assert str(stop.value.code).startswith("Kafka setting fetch.wait.max.ms is not supported by the Faust app")
    assert SECRET not in str(stop.value.code) + caplog.text
