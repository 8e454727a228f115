"""The `kafka:` block: merging, -X, secrets, redaction, kafka-python translation."""

from pathlib import Path

import pytest

from consumers.client_settings import REDACTED, is_secret, parse_x, redacted, settings_for
from consumers.kafka_python_settings import kafka_python_settings
from consumers.secret_values import SECRETS, scrub
from pipeline.config import KafkaOverrides, load_config
from pipeline.errors import UserError

SECRET = "s3cr3t-Zq9vX"


def test_common_then_role_wins() -> None:
    block = KafkaOverrides(
        common={"security.protocol": "SASL_SSL", "client.id": "all"},
        consumer={"client.id": "reader"},
        admin={"socket.timeout.ms": 5000},
    )
    assert settings_for(block, "consumer") == {"security.protocol": "SASL_SSL", "client.id": "reader"}
    assert settings_for(block, "producer") == {"security.protocol": "SASL_SSL", "client.id": "all"}
    assert block.client("admin") == {"security.protocol": "SASL_SSL", "client.id": "all", "socket.timeout.ms": 5000}


def test_unknown_role_is_a_bug() -> None:
    with pytest.raises(ValueError):
        settings_for(KafkaOverrides(), "streams")


def test_parse_x() -> None:
    assert parse_x(["a.b=1", "sasl.password=x=y", " c = "]) == {"a.b": "1", "sasl.password": "x=y", "c": " "}
    assert parse_x(None) == {}
    with pytest.raises(UserError, match="-X security.protocol: expected key=value"):
        parse_x(["security.protocol"])
    with pytest.raises(UserError) as err:
        parse_x([f"={SECRET}"])
    assert SECRET not in str(err.value)


def test_secret_keys() -> None:
    # Every property librdkafka marks sensitive (rdkafka_conf.c _RK_SENSITIVE), the
    # families the issue names, and the kafka-python / Java (Faust) names.
    for key in ("sasl.password", "sasl.username", "ssl.key.password", "ssl.key.pem", "ssl.key.location",
                "ssl.ca.pem", "ssl.keystore.password", "ssl.keystore.location", "sasl.oauthbearer.config",
                "sasl.oauthbearer.client.secret", "sasl.oauthbearer.assertion.private.key.pem",
                "sasl.oauthbearer.assertion.private.key.passphrase", "ssl.certificate.pem", "sasl.jaas.config",
                "sasl_plain_password", "ssl_password", "my.PASSWORD.thing", "some.secret", "SSL.KEY.PEM"):
        assert is_secret(key), key
    for key in ("security.protocol", "sasl.mechanism", "ssl.ca.location", "ssl.certificate.location",
                "sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.client.id", "client.id"):
        assert not is_secret(key), key
    assert redacted({"sasl.password": SECRET, "sasl.username": "u", "client.id": "c"}) == {
        "sasl.password": REDACTED, "sasl.username": REDACTED, "client.id": "c"}


def test_key_pem_from_file_keeps_its_lines(tmp_path: Path) -> None:
    pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"
    (tmp_path / "client.key").write_text(pem)
    block = KafkaOverrides(common={"ssl.key.pem": f"@file:{tmp_path}/client.key", "ssl.key.location": "/etc/k.key"})
    assert settings_for(block, "consumer", {}) == {"ssl.key.pem": pem, "ssl.key.location": "/etc/k.key"}


def test_resolved_secrets_are_masked_in_any_text() -> None:
    SECRETS.clear()
    pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\n-----END PRIVATE KEY-----\n"
    block = KafkaOverrides(common={"ssl.key.pem": pem, "sasl.oauthbearer.config": "principal=XoauthPrincipal81",
                                   "sasl.password": "${PW}", "sasl.username": "tidebatch",
                                   "ssl.key.location": "/etc/kafka/client.key"})
    settings_for(block, "producer", {"PW": SECRET})
    line = f"settings {block.common!r} {SECRET} {pem.splitlines()[1]} {{'pem': {pem!r}}}"
    shown = scrub(line)
    for leak in (SECRET, "XoauthPrincipal81", pem, pem.splitlines()[1], repr(pem)[1:-1]):
        assert leak not in shown, leak
    # Names and paths stay readable: they are not the secret.
    assert "tidebatch" in shown and "/etc/kafka/client.key" in shown
    assert scrub("nothing secret here") == "nothing secret here"
    SECRETS.clear()


def test_secret_from_env_and_file(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    path.write_text(f"{SECRET}\n")
    block = KafkaOverrides(common={"sasl.password": "${KAFKA_PW}", "ssl.key.password": f"@file:{path}",
                                   "client.id": "${NOT_A_SECRET}"})
    got = settings_for(block, "producer", {"KAFKA_PW": "from-env"})
    # Only secrets are references; other values are taken as written.
    assert got == {"sasl.password": "from-env", "ssl.key.password": SECRET, "client.id": "${NOT_A_SECRET}"}


def test_missing_secret_names_where_not_what(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="sasl.password: environment variable KAFKA_PW is not set"):
        settings_for(KafkaOverrides(common={"sasl.password": "${KAFKA_PW}"}), "admin", {})
    with pytest.raises(UserError, match="ssl.key.password: cannot read .*nope"):
        settings_for(KafkaOverrides(common={"ssl.key.password": f"@file:{tmp_path}/nope"}), "admin", {})


def test_config_repr_hides_secrets() -> None:
    cfg = load_config(overrides={"kafka": {"common": {"sasl.password": SECRET}, "producer": {"x.secret": SECRET}}},
                      environ={})
    assert SECRET not in repr(cfg)
    assert SECRET not in repr(cfg.kafka)
    assert cfg.kafka.client("producer")["x.secret"] == SECRET


def test_env_keys_become_dotted_names() -> None:
    cfg = load_config(environ={"TIDEBATCH_KAFKA__COMMON__SASL_PASSWORD": SECRET,
                               "TIDEBATCH_KAFKA__ADMIN__SECURITY_PROTOCOL": "SASL_SSL"})
    assert cfg.kafka.common == {"sasl.password": SECRET}
    assert cfg.kafka.admin == {"security.protocol": "SASL_SSL"}


def test_run_x_goes_into_common_over_the_file(tmp_path: Path) -> None:
    from pipeline.cli import build_parser
    from pipeline.commands.run import flag_overrides

    path = tmp_path / "w.yaml"
    path.write_text("kafka:\n  common:\n    security.protocol: SSL\n    client.id: file\n")
    args = build_parser().parse_args(["run", "-c", str(path), "-X", "security.protocol=SASL_SSL", "-X", "a.b=c"])
    cfg = load_config(args.config, flag_overrides(args), environ={})
    assert cfg.kafka.common == {"security.protocol": "SASL_SSL", "client.id": "file", "a.b": "c"}


def test_produce_and_etl_take_x() -> None:
    from pipeline.cli import build_parser
    from pipeline.commands.etl import build_job
    from pipeline.commands.kafka_flags import kafka_block

    parser = build_parser()
    args = parser.parse_args(["produce", "ctr", "--bootstrap-servers", "h:1", "-X", "sasl.username=u"])
    assert kafka_block(args).client("producer") == {"sasl.username": "u"}
    args = parser.parse_args(["etl", "-o", "out", "--topic", "t", "--bootstrap-servers", "h:1", "-X", "sasl.username=u"])
    job = build_job(args)
    assert job.kafka.client("consumer") == {"sasl.username": "u"}
    assert "sasl" not in repr(job)


def test_worker_clients_get_the_block(monkeypatch: pytest.MonkeyPatch) -> None:
    import consumers.confluent_backend as cb
    from pipeline.kafka_backend import make_producer

    seen: dict = {}
    monkeypatch.setattr(cb, "ConfluentProducer", seen.update)
    cfg = load_config(overrides={"kafka": {"common": {"client.id": "c"}, "producer": {"linger.ms": 7}}}, environ={})
    make_producer(cfg)
    assert seen["client.id"] == "c" and seen["linger.ms"] == 7


def test_kafka_python_translation() -> None:
    got = kafka_python_settings({
        "security.protocol": "sasl_ssl", "sasl.mechanism": "scram-sha-512", "sasl.username": "u",
        "sasl.password": SECRET, "ssl.ca.location": "/ca.pem", "ssl.certificate.location": "/c.pem",
        "ssl.key.location": "/k.pem", "fetch_max_wait_ms": 5,
    })
    assert got == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "u",
        "sasl_plain_password": SECRET, "ssl_cafile": "/ca.pem", "ssl_certfile": "/c.pem", "ssl_keyfile": "/k.pem",
        "fetch_max_wait_ms": 5,
    }


def test_kafka_python_refuses_what_it_cannot_honour() -> None:
    with pytest.raises(UserError, match=r"^Kafka setting ssl.endpoint.identification.algorithm is not supported"):
        kafka_python_settings({"ssl.endpoint.identification.algorithm": "none"})


def test_kafka_python_worker_refuses_at_build() -> None:
    from pipeline.kafka_backend import make_producer

    cfg = load_config(overrides={"kafka": {"common": {"socket.keepalive.enable": True}}}, environ={})
    cfg.client = "kafka-python"  # past load's own check: the backend refuses too
    with pytest.raises(UserError, match="socket.keepalive.enable"):
        make_producer(cfg)


def test_kafka_python_config_refused_at_load() -> None:
    with pytest.raises(UserError, match="linger.ms is not supported by client kafka-python"):
        load_config(overrides={"client": "kafka-python", "kafka": {"producer": {"linger.ms": 1}}}, environ={})


def test_reachability_check_refuses_bad_settings_in_one_line() -> None:
    from consumers.kafka_reachable import KafkaUnavailable, require_kafka

    with pytest.raises(KafkaUnavailable, match="^Kafka client settings refused: .*security.protocol"):
        require_kafka("127.0.0.1:1", 1, {"security.protocol": "BOGUS", "sasl.password": SECRET})
