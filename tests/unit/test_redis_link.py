"""The Redis link's view of AUTH and TLS failures (pipeline/redisio/failures.py, link.py)
and the redis section's TLS keys: classified, logged once, never showing a secret."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.redisio.config import RedisConfig
from pipeline.redisio.failures import AUTH, OUTAGE, TLS, classify, describe
from pipeline.redisio.link import RedisLink, make_client
from pipeline.redisio.metrics import register_redis_metrics

SECRET = "Xredis-secret-81"
URL = "rediss://127.0.0.1:6380/0"


def _wrapped(inner: BaseException, outer: BaseException) -> BaseException:
    """`outer` raised while handling `inner`, as redis-py raises its ConnectionError."""
    try:
        try:
            raise inner
        except BaseException:
            raise outer  # noqa: B904 (redis-py's way: the ssl error is the context)
    except BaseException as exc:
        return exc


def _verify_failed() -> BaseException:
    inner = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain")
    return _wrapped(inner, redis.ConnectionError("Error 1 connecting to 127.0.0.1:6380. [SSL: CERTIFICATE_VERIFY_FAILED] ..."))


def test_failures_are_classified_by_cause() -> None:
    assert classify(redis.AuthenticationError("invalid username-password pair or user is disabled.")) == AUTH
    assert classify(_verify_failed()) == TLS
    eof = _wrapped(ssl.SSLEOFError(8, "EOF occurred in violation of protocol"), redis.ConnectionError("Error 8"))
    assert classify(eof) == OUTAGE  # also what a server killed under a TLS connection gives
    assert classify(redis.ConnectionError("Error 111 connecting to 127.0.0.1:6380. Connection refused.")) == OUTAGE
    assert classify(redis.TimeoutError("Timeout reading from socket")) == OUTAGE


def test_the_lines_name_the_cause_and_the_ssl_reason() -> None:
    auth = describe(AUTH, redis.AuthenticationError("invalid username-password pair\nmore"), URL, "tidebatch")
    assert auth.startswith(f"redis: authentication failed for user 'tidebatch' at {URL} (wrong password")
    assert auth.endswith(": invalid username-password pair") and "\n" not in auth
    assert describe(AUTH, redis.AuthenticationError("user is disabled."), URL, "u").endswith(": user is disabled")
    tls = describe(TLS, _verify_failed(), URL, "tidebatch")
    assert tls.startswith(f"redis: TLS handshake with {URL} failed") and "redis.tls_ca_file" in tls
    assert tls.endswith("self-signed certificate in certificate chain") and "Error 1 connecting" not in tls


def _link(rc: RedisConfig) -> tuple[RedisLink, CollectorRegistry]:
    registry = CollectorRegistry()
    # client given: nothing connects, the monitor is never started
    return RedisLink(rc, register_redis_metrics(registry), client=redis.Redis()), registry


def test_an_auth_failure_is_logged_once_and_kept_as_the_problem_until_up(caplog) -> None:
    caplog.set_level(logging.INFO, logger="pipeline.redisio.link")
    link, registry = _link(RedisConfig(url=f"rediss://tidebatch:{SECRET}@127.0.0.1:6380/0"))
    wrong = redis.AuthenticationError("invalid username-password pair or user is disabled.")
    link.failed("connect", wrong)
    for _ in range(5):  # hooks and the monitor's retries
        link._explain(wrong)
        link.failed("features", wrong)
    assert link.problem is not None and "user 'tidebatch'" in link.problem
    assert [(r.name, r.levelname) for r in caplog.records] == [("pipeline.redisio.link", "ERROR")]
    assert registry.get_sample_value("tidebatch_redis_outages_total") == 1
    problem = link.problem
    # A plain failure after it (a server refusing a missing client certificate
    # alternates a TLS alert with a bare EOF): silent, and the worker stays unready.
    link._explain(redis.ConnectionError("Error 8 while writing to socket. EOF occurred"))
    assert link.problem == problem and len(caplog.records) == 1
    link._explain(_verify_failed())  # another cause: its own line
    assert link.problem.startswith("redis: TLS handshake") and len(caplog.records) == 2
    link._mark_up()
    assert link.up and link.problem is None
    text = caplog.text + repr(link.problem) + link.url
    assert SECRET not in text and "***" in link.url


def test_a_plain_outage_is_no_problem_for_readiness(caplog) -> None:
    link, _ = _link(RedisConfig(url="redis://127.0.0.1:6380/0", password=SECRET))
    link.failed("connect", redis.ConnectionError("Error 111 connecting. Connection refused."))
    assert not link.up and link.problem is None
    assert link.user == "default"


@pytest.mark.parametrize(
    ("redis_keys", "message"),
    [
        ({"url": URL, "tls_cert_file": "c.pem"}, "config key 'redis.tls_key_file': must be set with redis.tls_cert_file"),
        ({"url": URL, "tls_key_file": "k.pem"}, "config key 'redis.tls_cert_file': must be set with redis.tls_key_file"),
        ({"url": "redis://h:6379/0", "tls_ca_file": "ca.pem"}, "config key 'redis.tls_ca_file': needs TLS"),
    ],
)
def test_tls_keys_are_validated_when_the_config_loads(redis_keys, message) -> None:
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(")):
        load_config(overrides={"redis": redis_keys}, environ={})


def test_tls_with_redis_tls_true_and_client_certificate_files_reach_redis_py(tmp_path: Path) -> None:
    for name in ("ca.pem", "c.pem", "k.pem"):
        (tmp_path / name).write_text("x")
    rc = load_config(overrides={"redis": {
        "url": "redis://h:6380/0", "tls": True, "tls_ca_file": str(tmp_path / "ca.pem"),
        "tls_cert_file": str(tmp_path / "c.pem"), "tls_key_file": str(tmp_path / "k.pem"),
    }}, environ={}).redis
    kwargs = make_client(rc).connection_pool.connection_kwargs
    assert kwargs["ssl_certfile"].endswith("c.pem") and kwargs["ssl_keyfile"].endswith("k.pem")
    assert kwargs["ssl_ca_certs"].endswith("ca.pem") and kwargs["ssl_check_hostname"] is True


def test_a_missing_tls_file_is_one_line_naming_the_key_when_the_client_is_made(tmp_path: Path) -> None:
    rc = RedisConfig(url=URL, tls_ca_file=str(tmp_path / "nope.pem"))
    with pytest.raises(UserError, match=r"^config key 'redis.tls_ca_file': file not found: .*nope.pem$"):
        make_client(rc)


def test_repr_of_the_config_hides_both_passwords() -> None:
    rc = RedisConfig(url=f"redis://tb:{SECRET}@h:6379/0", password=SECRET + "2")
    cfg = load_config(overrides={"redis": {"url": rc.url, "password": rc.password}}, environ={})
    for text in (repr(rc), repr(cfg), str(cfg)):
        assert SECRET not in text and "password='***'" in text and "tb:***@h:6379" in text


def test_the_password_and_username_keys_win_over_the_urls() -> None:
    """docs/REDIS.md: `password` overrides a password in the URL. redis-py's from_url
    applies the URL's credentials last, so they used to win: a password rotated through
    TIDEBATCH_REDIS__PASSWORD was ignored while the URL still carried the old one."""
    kwargs = make_client(RedisConfig(url="redis://old:url%40pw@h:6379/3", password="new", username="tb")).connection_pool.connection_kwargs
    assert (kwargs["password"], kwargs["username"], kwargs["host"], kwargs["db"]) == ("new", "tb", "h", 3)
    kwargs = make_client(RedisConfig(url="redis://old:url%40pw@h:6379/3")).connection_pool.connection_kwargs
    assert (kwargs["password"], kwargs["username"]) == ("url@pw", "old")
    unix = RedisConfig(url="unix:///run/redis.sock?db=1", password="p")
    assert unix.connection() == ("unix:///run/redis.sock?db=1", None, "p")


def test_the_hostname_check_can_be_dropped_but_not_verification() -> None:
    kwargs = make_client(RedisConfig(url=URL, tls_check_hostname=False)).connection_pool.connection_kwargs
    assert kwargs["ssl_check_hostname"] is False and kwargs.get("ssl_cert_reqs", "required") == "required"


def test_the_password_may_be_an_env_or_file_reference_and_an_error_never_shows_it(tmp_path) -> None:
    secret = tmp_path / "redis-password"
    secret.write_text("from-file\n")
    for ref, env, expect in (("${RPW}", {"RPW": "from-env"}, "from-env"), (f"@file:{secret}", {}, "from-file")):
        kwargs = make_client(RedisConfig(password=ref), environ=env).connection_pool.connection_kwargs
        assert kwargs["password"] == expect
    with pytest.raises(UserError) as err:
        make_client(RedisConfig(password="${MISSING_RPW}"), environ={})
    assert str(err.value) == "config key redis.password: environment variable MISSING_RPW is not set"
