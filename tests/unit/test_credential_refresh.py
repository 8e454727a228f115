"""consumers/credential_refresh.py: a refused login re-reads the kafka: block's secret
references, hands changed credentials to the live clients, or stops with one line.
Fake clients and a fake clock; the broker side is tests/integration/test_kafka_rotation.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from consumers.client_settings import settings_for
from consumers.credential_refresh import CredentialRefresh, refresh_for, replaceable
from consumers.kafka_failures import AUTHENTICATION, TOPIC_AUTHORIZATION, UNREACHABLE, KafkaFailure
from consumers.records import KafkaRefused
from pipeline.config import KafkaOverrides

ADDR = "127.0.0.1:9093"
REFUSED = KafkaFailure(AUTHENTICATION, f"Kafka authentication failed at {ADDR}: SASL authentication error")


class FakeClient:
    def __init__(self) -> None:
        self.given: list[tuple[str, str]] = []

    def set_sasl_credentials(self, username: str, password: str) -> None:
        self.given.append((username, password))


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def scram(password_ref: str, **role: dict[str, str]) -> KafkaOverrides:
    common = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
              "sasl.username": "worker", "sasl.password": password_ref}
    return KafkaOverrides(common=common, **role)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "password"
    path.write_text("old-secret\n")
    return path


def refresh_with_clients(block: KafkaOverrides, clock: FakeClock | None = None) -> tuple[CredentialRefresh, FakeClient, FakeClient]:
    refresh = CredentialRefresh(block, ADDR, environ={}, clock=clock or FakeClock())
    consumer, producer = FakeClient(), FakeClient()
    refresh.attach("consumer", consumer, settings_for(block, "consumer", {}))  # as it was made
    refresh.attach("producer", producer, settings_for(block, "producer", {}))
    return refresh, consumer, producer


def test_nothing_heard_nothing_done(secret: Path) -> None:
    refresh, consumer, producer = refresh_with_clients(scram(f"@file:{secret}"))
    secret.write_text("new-secret")
    refresh.check()
    assert consumer.given == producer.given == []


def test_other_failures_are_not_a_refused_login(secret: Path) -> None:
    refresh, consumer, _ = refresh_with_clients(scram(f"@file:{secret}"))
    refresh.heard(KafkaFailure(UNREACHABLE, "down"))
    refresh.heard(KafkaFailure(TOPIC_AUTHORIZATION, "no ACL"))
    refresh.check()  # neither re-reads nor raises
    assert consumer.given == []


def test_a_rewritten_file_goes_to_every_live_client(secret: Path, caplog: pytest.LogCaptureFixture) -> None:
    refresh, consumer, producer = refresh_with_clients(scram(f"@file:{secret}"))
    secret.write_text("new-secret\n")
    refresh.heard(REFUSED)
    refresh.heard(REFUSED)  # the consumer's and the producer's reports: one re-read
    with caplog.at_level(logging.WARNING):
        refresh.check()
    assert consumer.given == producer.given == [("worker", "new-secret")]
    assert f"sasl.password from @file:{secret}" in caplog.text and "log in with the new ones" in caplog.text
    assert "new-secret" not in caplog.text
    refresh.check()  # the failure was dealt with
    assert consumer.given == [("worker", "new-secret")]


def test_an_unchanged_secret_stops_with_one_line_naming_the_reference_only(secret: Path) -> None:
    refresh, consumer, _ = refresh_with_clients(scram(f"@file:{secret}"))
    refresh.heard(REFUSED)
    with pytest.raises(KafkaRefused) as caught:
        refresh.check()
    line = str(caught.value)
    assert line.startswith(f"Kafka authentication failed at {ADDR} after the credentials changed on the broker")
    assert "they have not changed here" in line and f"sasl.password from @file:{secret}" in line
    assert "\n" not in line and "old-secret" not in line
    assert consumer.given == []


def test_a_password_given_as_a_value_is_never_shown() -> None:
    refresh, _, _ = refresh_with_clients(scram("plain-value-pw"))
    refresh.heard(REFUSED)
    with pytest.raises(KafkaRefused) as caught:
        refresh.check()
    assert "plain-value-pw" not in str(caught.value)
    assert "given as values" in str(caught.value)


def test_an_environment_reference_cannot_change_under_a_running_process() -> None:
    block = scram("${KAFKA_PW}")
    env = {"KAFKA_PW": "env-secret"}
    refresh = CredentialRefresh(block, ADDR, environ=env, clock=FakeClock())
    refresh.attach("consumer", FakeClient(), settings_for(block, "consumer", env))
    refresh.heard(REFUSED)
    with pytest.raises(KafkaRefused, match=r"sasl\.password from \$\{KAFKA_PW\}") as caught:
        refresh.check()
    assert "env-secret" not in str(caught.value)


def test_new_credentials_refused_too_stop_once_the_old_logins_have_settled(secret: Path) -> None:
    clock = FakeClock()
    refresh, consumer, _ = refresh_with_clients(scram(f"@file:{secret}"), clock)
    secret.write_text("new-secret")
    refresh.heard(REFUSED)
    refresh.check()
    clock.now += 1.0  # a login begun with the old password reports late: not the new one's fault
    refresh.heard(REFUSED)
    refresh.check()
    clock.now += 10.0
    refresh.heard(REFUSED)
    with pytest.raises(KafkaRefused, match="the new ones were refused too"):
        refresh.check()
    assert consumer.given == [("worker", "new-secret")]


def test_a_second_rotation_is_followed_too(secret: Path) -> None:
    clock = FakeClock()
    refresh, consumer, _ = refresh_with_clients(scram(f"@file:{secret}"), clock)
    for n in (1, 2):
        secret.write_text(f"pw-{n}")
        clock.now += 60.0
        refresh.heard(REFUSED)
        refresh.check()
    assert consumer.given == [("worker", "pw-1"), ("worker", "pw-2")]


def test_a_later_rotation_the_file_does_not_follow_says_unchanged(secret: Path) -> None:
    clock = FakeClock()
    refresh, _, _ = refresh_with_clients(scram(f"@file:{secret}"), clock)
    secret.write_text("pw-1")
    refresh.heard(REFUSED)
    refresh.check()
    clock.now += 3600.0  # the next rotation, on the broker alone
    refresh.heard(REFUSED)
    with pytest.raises(KafkaRefused, match="they have not changed here"):
        refresh.check()


def test_without_hand_over_new_credentials_stop_the_worker_too(secret: Path) -> None:
    block = scram(f"@file:{secret}")
    refresh = CredentialRefresh(block, ADDR, environ={}, clock=FakeClock(), hand_over=False)
    consumer = FakeClient()
    refresh.attach("consumer", consumer, settings_for(block, "consumer", {}))
    secret.write_text("new-secret")
    refresh.heard(REFUSED)
    with pytest.raises(KafkaRefused, match="the new ones are there .*its restart reads them") as caught:
        refresh.check()
    assert consumer.given == [] and "new-secret" not in str(caught.value)


def test_each_role_gets_its_own_credentials(tmp_path: Path) -> None:
    consumer_pw, producer_pw = tmp_path / "c", tmp_path / "p"
    consumer_pw.write_text("c1")
    producer_pw.write_text("p1")
    block = scram(f"@file:{consumer_pw}", producer={"sasl.username": "writer", "sasl.password": f"@file:{producer_pw}"})
    refresh, consumer, producer = refresh_with_clients(block)
    producer_pw.write_text("p2")
    refresh.heard(REFUSED)
    refresh.check()
    assert consumer.given == [] and producer.given == [("writer", "p2")]


def test_a_secret_file_gone_is_one_line_naming_the_path(secret: Path) -> None:
    refresh, _, _ = refresh_with_clients(scram(f"@file:{secret}"))
    secret.unlink()
    refresh.heard(REFUSED)
    with pytest.raises(KafkaRefused, match=rf"after the credentials changed on the broker: .*cannot read {secret}"):
        refresh.check()


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, False),
        ({"security.protocol": "SSL"}, False),
        ({"security.protocol": "SASL_SSL"}, False),  # GSSAPI: no password to replace
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}, False),
        ({"security.protocol": "sasl_ssl", "sasl.mechanism": "scram-sha-256"}, True),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN"}, True),
    ],
)
def test_only_username_and_password_logins_are_replaceable(settings: dict[str, str], expected: bool) -> None:
    assert replaceable(settings) is expected


def test_refresh_for_plaintext_is_none(secret: Path) -> None:
    assert refresh_for(KafkaOverrides(), ADDR) is None
    assert refresh_for(scram(f"@file:{secret}"), ADDR) is not None
