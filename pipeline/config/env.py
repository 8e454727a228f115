"""TIDEBATCH_* environment variables as config overrides, each read by the type its key
declares (pipeline/config/sections.py), never guessed from its text.

Before, every value was parsed as a YAML 1.1 scalar: TIDEBATCH_GROUP_ID=0123 failed
("expected str, got 83"), TIDEBATCH_INPUT_TOPIC=no became False and a password 0777
silently became the integer 511. Now a value stays text (`EnvText`) until the config
is built, and `read_env` turns it into what the key's type asks for: a string stays
the string it was. Only values whose type is a list, a mapping or free-form (the
librdkafka settings under `kafka:`) are parsed as YAML, because a shell has no other
way to spell them; a secret's value never is.

A variable that names no config key is a warning naming the closest key and is then
ignored: a Kubernetes Service whose name starts with `tidebatch` injects variables
such as TIDEBATCH_WORKER_PORT into every pod of its namespace, and a worker must not
stop on them.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from consumers.client_settings import env_key, is_secret

log = logging.getLogger(__name__)

ENV_PREFIX = "TIDEBATCH_"
# The Faust example app's own settings (examples/faust_ctr) and the test suite's
# (TIDEBATCH_TEST_BROKER, tests/integration/conftest.py) share the prefix but are not
# worker keys, nor what `run --processes` hands its children (pipeline/app/children.py).
NOT_WORKER_PREFIXES = ("TIDEBATCH_FAUST_", "TIDEBATCH_TEST_", "TIDEBATCH_CHILD_", "TIDEBATCH_MODEL_HOST")
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


class EnvText(str):
    """A value from the environment, not yet read as its key's type."""


def env_overrides(
    environ: Mapping[str, str], root: type, warn: Callable[[str], None] = log.warning
) -> dict:
    """{key: EnvText} trees from the TIDEBATCH_* variables that name a key of the
    dataclass `root`; each other one is `warn`ed about and left out."""
    tree: dict = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name == ENV_PREFIX or name.startswith(NOT_WORKER_PREFIXES):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX):].split("__")]
        if len(path) == 3 and path[0] == "kafka":  # librdkafka names have dots
            path[2] = env_key(path[2])
        unknown = _unknown_part(root, path)
        if unknown is not None:
            warn(f"ignoring environment variable {name}: {unknown}")
            continue
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else node
        node[path[-1]] = EnvText(raw)
    return tree


def _unknown_part(root: type, path: list[str]) -> str | None:
    """Why `path` names no key under `root` (with the closest key), or None."""
    cls: Any = root
    for depth, part in enumerate(path):
        if not dataclasses.is_dataclass(cls):
            # A mapping (kafka.common, batching.priority_slo_ms): any key, one level.
            return None if depth == len(path) - 1 and _is_mapping(cls) else f"'{'.'.join(path)}' is not a config key"
        hints = typing.get_type_hints(cls)
        if part not in hints:
            prefix = ".".join(path[:depth])
            close = difflib.get_close_matches(part, list(hints), n=1)
            guess = f"; did you mean {_env_name([*path[:depth], close[0]])}?" if close else ""
            return f"config key '{prefix + '.' if prefix else ''}{part}' is not known{guess}"
        cls = _strip_optional(hints[part])
    return None if not dataclasses.is_dataclass(cls) else f"'{'.'.join(path)}' is a section, not a key"


def _env_name(path: list[str]) -> str:
    return ENV_PREFIX + "__".join(p.upper() for p in path)


def _strip_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return inner[0] if len(inner) == 1 else tp
    return tp


def _is_mapping(tp: Any) -> bool:
    return typing.get_origin(tp) is dict


def read_env(text: EnvText, tp: Any, key: str) -> Any:
    """`text` as the type `tp` of config key `key` asks for; raises ValueError with the
    reason (the caller names the key)."""
    optional = typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)
    inner = _strip_optional(tp)
    if optional and text.strip() == "":
        return None
    if inner is str:
        return str(text)
    if inner is bool:
        word = text.strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise ValueError(f"expected true or false, got {text!r}")
    if inner is int:
        try:
            return int(text.strip())
        except ValueError:
            raise ValueError(f"expected an integer, got {text!r}") from None
    if inner is float:
        try:
            return float(text.strip())
        except ValueError:
            raise ValueError(f"expected a number, got {text!r}") from None
    if is_secret(key) or key.endswith("_token"):
        return str(text)  # a password stays the characters it was, whatever they look like
    # Lists, mappings and free-form values (librdkafka's settings): YAML is the only
    # way a shell can spell them.
    try:
        return yaml.safe_load(text) if text != "" else None
    except yaml.YAMLError:
        return str(text)
