"""The `redis` section of the worker config (docs/REDIS.md).

Nothing here imports redis-py: pipeline.config imports this module, and commands that
never touch Redis must not pay for it. Every key is overridable from the environment
like any other, e.g. TIDEBATCH_REDIS__URL=rediss://cache:6380/0,
TIDEBATCH_REDIS__PASSWORD=..., TIDEBATCH_REDIS__FEATURES__ENABLED=true.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

DEDUP_ACTIONS = ("flag", "drop")
FEATURE_LOOKUPS = ("script", "pipeline")
_SCHEMES = ("redis", "rediss", "unix")


@dataclass
class RedisFeaturesConfig:
    enabled: bool = False  # id-only CTR requests; features from tb:user:<id> / tb:item:<id>
    lookup: str = "script"  # one EVALSHA per batch; "pipeline": HMGETs (servers without Lua)


@dataclass
class RedisStoreConfig:
    enabled: bool = False  # latest scores (tb:score:<user>) and results (tb:req:<id>)
    buffer_max: int = 100_000  # results held for retry while Redis is away; oldest dropped beyond
    flush_timeout_s: float = 2.0  # how long shutdown waits for the buffer to reach Redis


@dataclass
class RedisDedupConfig:
    enabled: bool = False  # recognise replayed request ids (SET NX)
    action: str = "flag"  # flag: publish with "duplicate": true; drop: do not publish
    ttl_s: float = 86_400.0  # how long a request id is remembered (the replay window)


@dataclass(repr=False)  # __repr__ below: a config printed or logged shows no password
class RedisConfig:
    url: str = "redis://127.0.0.1:6379/0"
    password: str | None = None  # overrides a password in the URL
    username: str | None = None  # ACL user (Redis 6+); None: the `default` user
    tls: bool = False  # true turns redis:// into rediss://
    tls_ca_file: str | None = None  # CA bundle for a private CA (rediss://)
    # Mutual TLS: a client certificate for servers started with tls-auth-clients yes
    # (self-hosted Redis' default; managed services usually ask for none). Both or neither.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_check_hostname: bool = True  # the certificate must name the URL's host
    key_prefix: str = "tb:"
    ttl_s: float = 3600.0  # lifetime of tb:score:* and tb:req:* entries
    # Short timeouts: a dead or hung Redis must cost a batch milliseconds, not seconds.
    socket_timeout_ms: float = 100.0
    connect_timeout_ms: float = 100.0
    backoff_max_s: float = 2.0  # longest pause between reconnect attempts during an outage
    features: RedisFeaturesConfig = field(default_factory=RedisFeaturesConfig)
    store: RedisStoreConfig = field(default_factory=RedisStoreConfig)
    dedup: RedisDedupConfig = field(default_factory=RedisDedupConfig)

    @property
    def used(self) -> bool:
        """Redis is contacted only when one of its features is switched on."""
        return self.features.enabled or self.store.enabled or self.dedup.enabled

    def effective_url(self) -> str:
        """The URL to connect to: `tls: true` upgrades redis:// to rediss://."""
        if self.tls and self.url.startswith("redis://"):
            return "rediss://" + self.url[len("redis://"):]
        return self.url

    def connection(self) -> tuple[str, str | None, str | None]:
        """(URL without credentials, username, password): `username` and `password`
        win over the URL's. redis-py would let the URL's win (from_url applies them
        last), so the credentials must leave the URL before it gets there."""
        url = self.effective_url()
        parts = urlsplit(url)
        bare = url  # unix:///path has no netloc: urlunsplit would drop its "//"
        if "@" in parts.netloc:
            host = parts.netloc.rpartition("@")[2]
            bare = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
        user = self.username if self.username is not None else _unquoted(parts.username)
        password = self.password if self.password is not None else _unquoted(parts.password)
        return bare, user or None, password

    def tls_files(self) -> dict[str, str]:
        """{config key: path} of the TLS files set."""
        keys = ("tls_ca_file", "tls_cert_file", "tls_key_file")
        return {f"redis.{k}": getattr(self, k) for k in keys if getattr(self, k)}

    def __repr__(self) -> str:
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "url":
                value = redacted_url(value)
            elif f.name == "password" and value is not None:
                value = "***"
            shown.append(f"{f.name}={value!r}")
        return f"RedisConfig({', '.join(shown)})"


def _unquoted(text: str | None) -> str | None:
    return None if text is None else unquote(text)


def redacted_url(url: str) -> str:
    """The URL without its password, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment))


def require_tls_files(rc: RedisConfig, bad: Callable[[str, str], Exception]) -> None:
    """Raise bad(key, why) for a TLS file that is not there. Checked when a client is
    made, not when the config loads: the files are often mounted only where it runs."""
    for key, path in rc.tls_files().items():
        if not Path(path).is_file():
            raise bad(key, f"file not found: {path}")


def validate_redis(rc: RedisConfig, bad: Callable[[str, str], Exception]) -> None:
    """Raise bad(key, why) for the first invalid key of the redis section."""
    scheme = urlsplit(rc.url).scheme
    if scheme not in _SCHEMES:
        raise bad("redis.url", f"scheme {scheme or '(none)'!r} is not one of redis://, rediss://, unix://")
    if rc.tls and scheme == "unix":
        raise bad("redis.tls", "TLS needs a TCP URL (redis:// or rediss://), not unix://")
    if bool(rc.tls_cert_file) != bool(rc.tls_key_file):
        given, missing = ("tls_cert_file", "tls_key_file") if rc.tls_cert_file else ("tls_key_file", "tls_cert_file")
        raise bad(f"redis.{missing}", f"must be set with redis.{given} (a client certificate needs both)")
    tls_keys = rc.tls_files()
    if tls_keys and not rc.effective_url().startswith("rediss://"):
        # Silently connecting in plain text to a server meant to be reached over TLS
        # would send the password in the clear.
        raise bad(next(iter(tls_keys)), "needs TLS: a rediss:// URL or redis.tls: true")
    if not rc.key_prefix:
        raise bad("redis.key_prefix", "must not be empty (it keeps tidebatch's keys apart)")
    for key, value in (
        ("redis.ttl_s", rc.ttl_s),
        ("redis.dedup.ttl_s", rc.dedup.ttl_s),
        ("redis.socket_timeout_ms", rc.socket_timeout_ms),
        ("redis.connect_timeout_ms", rc.connect_timeout_ms),
        ("redis.backoff_max_s", rc.backoff_max_s),
        ("redis.store.flush_timeout_s", rc.store.flush_timeout_s),
    ):
        if value <= 0:
            raise bad(key, "must be > 0")
    if rc.store.buffer_max < 0:
        raise bad("redis.store.buffer_max", "must be >= 0 (0 = keep nothing during an outage)")
    if rc.features.lookup not in FEATURE_LOOKUPS:
        raise bad("redis.features.lookup", f"{rc.features.lookup!r} is not one of {', '.join(FEATURE_LOOKUPS)}")
    if rc.dedup.action not in DEDUP_ACTIONS:
        raise bad("redis.dedup.action", f"{rc.dedup.action!r} is not one of {', '.join(DEDUP_ACTIONS)}")
