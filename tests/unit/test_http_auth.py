"""`metrics.auth`: the config and its validation, redaction, resolving the password and
token from references, the Authorization header check, which paths it guards, and the
start-up warning for a server others can reach without credentials."""

from __future__ import annotations

import base64
import hmac
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.ops import http_auth
from pipeline.ops.http_auth import HttpAuth, exposure_warning, is_loopback
from pipeline.ops.http_config import HttpAuthConfig

PASSWORD = "pw-Kq8ZtW3x"
TOKEN = "tok-Vd5Rj2Lm"


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _auth(**kw: object) -> HttpAuth:
    cfg = HttpAuthConfig(**{"username": "ops", "password": PASSWORD, "bearer_token": TOKEN, **kw})
    auth = HttpAuth.from_config(cfg, environ={})
    assert auth is not None
    return auth


def _cfg(auth: dict, environ: dict | None = None, **metrics: object):
    return load_config(overrides={"metrics": {"auth": auth, **metrics}}, environ=environ or {})


# ----------------------------------------------------------------------------- header check
def test_basic_auth_needs_the_user_and_the_password() -> None:
    auth = _auth(bearer_token=None)
    assert auth.allows(_basic("ops", PASSWORD))
    assert auth.allows("basic " + _basic("ops", PASSWORD).split()[1])  # the scheme is case-blind
    assert not auth.allows(_basic("ops", PASSWORD + "x"))
    assert not auth.allows(_basic("admin", PASSWORD))
    assert not auth.allows(_basic("ops", ""))
    assert not auth.allows("Basic not*base64")
    assert not auth.allows("Basic ")
    assert not auth.allows(None)
    assert not auth.allows("")
    assert not auth.allows(f"Bearer {TOKEN}"), "no token configured: a bearer header is not enough"


def test_bearer_token() -> None:
    auth = _auth(username=None, password=None)
    assert auth.allows(f"Bearer {TOKEN}")
    assert auth.allows(f"bearer  {TOKEN} ")
    assert not auth.allows(f"Bearer {TOKEN}x")
    assert not auth.allows(f"Bearer {TOKEN[:-1]}")
    assert not auth.allows("Bearer ")
    assert not auth.allows(TOKEN)
    assert not auth.allows(_basic("ops", TOKEN))


def test_with_both_set_either_is_accepted() -> None:
    auth = _auth()
    assert auth.allows(_basic("ops", PASSWORD)) and auth.allows(f"Bearer {TOKEN}")
    assert not auth.allows(f"Bearer {PASSWORD}") and not auth.allows(_basic("ops", TOKEN))


def test_comparisons_take_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every accept or refuse is hmac.compare_digest's answer, never `==` (whose time
    says how long a prefix of the guess was right)."""
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(http_auth.hmac, "compare_digest", spy)
    auth = _auth()
    assert auth.allows(f"Bearer {TOKEN}") and not auth.allows("Bearer nope")
    assert auth.allows(_basic("ops", PASSWORD)) and not auth.allows(_basic("ops", "nope"))
    assert calls == [(TOKEN.encode(), TOKEN.encode()), (b"nope", TOKEN.encode()),
                     (f"ops:{PASSWORD}".encode(),) * 2, (b"ops:nope", f"ops:{PASSWORD}".encode())]


def test_challenges_name_each_configured_scheme_basic_first() -> None:
    assert _auth().challenges() == ['Basic realm="tidebatch", charset="UTF-8"', 'Bearer realm="tidebatch"']
    assert _auth(username=None, password=None).challenges() == ['Bearer realm="tidebatch"']


def test_probes_stay_open_metrics_unless_protected_everything_else_guarded() -> None:
    auth = _auth()
    assert not auth.protects("/healthz") and not auth.protects("/readyz")
    assert not auth.protects("/metrics")
    for path in ("/", "/index.html", "/api/stats", "/static/dashboard.js", "/nope"):
        assert auth.protects(path), path
    strict = _auth(protect_metrics=True)
    assert strict.protects("/metrics") and not strict.protects("/healthz") and not strict.protects("/readyz")


# ----------------------------------------------------------------------------- resolving
def test_no_credentials_means_no_check() -> None:
    assert HttpAuth.from_config(HttpAuthConfig(), environ={}) is None


def test_password_and_token_from_env_and_file(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    cfg = HttpAuthConfig(username="ops", password="${OPS_PW}", bearer_token=f"@file:{token_file}")
    auth = HttpAuth.from_config(cfg, environ={"OPS_PW": PASSWORD})
    assert auth is not None
    assert auth.allows(_basic("ops", PASSWORD)) and auth.allows(f"Bearer {TOKEN}")
    assert not auth.allows(_basic("ops", "${OPS_PW}")), "the reference is not the password"
    assert PASSWORD not in repr(auth) and TOKEN not in repr(auth)


def test_unresolvable_references_name_the_key_never_a_value(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"config key metrics.auth.bearer_token: environment variable OPS_TOKEN is not set"):
        HttpAuth.from_config(HttpAuthConfig(bearer_token="${OPS_TOKEN}"), environ={})
    with pytest.raises(UserError, match=r"metrics.auth.password: cannot read .*missing"):
        HttpAuth.from_config(HttpAuthConfig(username="u", password=f"@file:{tmp_path / 'missing'}"), environ={})
    with pytest.raises(UserError, match=r"'metrics.auth.bearer_token': resolves to an empty value"):
        HttpAuth.from_config(HttpAuthConfig(bearer_token="${EMPTY}"), environ={"EMPTY": ""})


# ----------------------------------------------------------------------------- config
def test_config_from_yaml_keys_and_environment() -> None:
    cfg = _cfg({"username": "ops", "password": "${OPS_PW}"})
    assert cfg.metrics.auth.username == "ops" and cfg.metrics.auth.password == "${OPS_PW}"
    assert cfg.metrics.host == "127.0.0.1" and cfg.metrics.auth.protect_metrics is False
    env = {"TIDEBATCH_METRICS__HOST": "0.0.0.0", "TIDEBATCH_METRICS__AUTH__BEARER_TOKEN": "@file:/run/token",
           "TIDEBATCH_METRICS__AUTH__PROTECT_METRICS": "true"}
    cfg = load_config(environ=env)
    assert cfg.metrics.auth.bearer_token == "@file:/run/token" and cfg.metrics.auth.protect_metrics is True
    assert load_config(environ={}).metrics.auth.enabled is False


@pytest.mark.parametrize(("auth", "message"), [
    ({"username": "ops"}, r"'metrics.auth.password': basic auth needs both"),
    ({"password": PASSWORD}, r"'metrics.auth.username': basic auth needs both"),
    ({"username": "o:ps", "password": PASSWORD}, r"'metrics.auth.username': must not contain ':'"),
    ({"bearer_token": ""}, r"'metrics.auth.bearer_token': is empty"),
    ({"protect_metrics": True}, r"'metrics.auth.protect_metrics': needs credentials"),
    ({"bearer": TOKEN}, r"'metrics.auth.bearer' is not known; did you mean 'metrics.auth.bearer_token'"),
])
def test_config_validation(auth: dict, message: str) -> None:
    with pytest.raises(UserError, match=message) as err:
        _cfg(auth)
    assert PASSWORD not in str(err.value) and TOKEN not in str(err.value)


def test_a_dumped_config_shows_no_credential() -> None:
    cfg = _cfg({"username": "ops", "password": PASSWORD, "bearer_token": TOKEN})
    text = repr(cfg)
    assert PASSWORD not in text and TOKEN not in text
    assert "HttpAuthConfig(username='ops', password='***', bearer_token='***', protect_metrics=False)" in text
    assert repr(HttpAuthConfig()) == "HttpAuthConfig(protect_metrics=False)"


# ----------------------------------------------------------------------------- binding
@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.7", False), ("worker.example.com", False),
])
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_warning_only_when_others_can_connect_without_credentials() -> None:
    warning = exposure_warning("0.0.0.0", None)
    assert warning is not None
    assert "0.0.0.0" in warning and "metrics.auth" in warning and "/api/stats" in warning
    assert exposure_warning("127.0.0.1", None) is None
    assert exposure_warning("0.0.0.0", _auth()) is None


def test_a_wrongly_typed_secret_is_not_shown_in_the_error() -> None:
    """An unquoted all-digit password in YAML arrives as an int: refused, not shown. From
    the environment it stays the string it was (pipeline/config/env.py)."""
    for name in ("password", "bearer_token"):
        auth = {"username": "ops", "password": "pw", name: 83917264}
        with pytest.raises(UserError, match=rf"'metrics.auth.{name}': expected str, got a value of type int") as err:
            load_config(overrides={"metrics": {"auth": auth}}, environ={})
        assert "83917264" not in str(err.value)
        env = {"TIDEBATCH_METRICS__AUTH__USERNAME": "ops", "TIDEBATCH_METRICS__AUTH__PASSWORD": "pw",
               f"TIDEBATCH_METRICS__AUTH__{name.upper()}": "0777"}
        assert getattr(load_config(environ=env).metrics.auth, name) == "0777"
