"""Reading a configuration: the YAML file, then the environment, then CLI overrides, each
value coerced to its key's declared type with an error that names the key."""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from consumers.client_settings import is_secret
from pipeline.config.checks import validate
from pipeline.config.env import EnvText, env_overrides, read_env
from pipeline.config.sections import WorkerConfig
from pipeline.errors import UserError, config_key_error


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    if isinstance(value, EnvText):
        try:
            value = read_env(value, tp, key)
        except ValueError as exc:
            raise config_key_error(key, str(exc)) from None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _coerce(value, inner[0], key)
        for tp_ in inner:  # int | str (runtime.processes: 2 or "auto"): the first that takes it
            try:
                return _coerce(value, tp_, key)
            except UserError:
                pass
        names = " or ".join(_type_name(t) for t in inner)
        raise UserError(f"config key '{key}': expected {names}, got a value of type {type(value).__name__}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise UserError(f"config key '{key}': expected a mapping, got {type(value).__name__}")
        return _build(tp, value, key + ".")
    if origin is dict:
        if not isinstance(value, Mapping):
            raise UserError(f"config key '{key}': expected a mapping, got {type(value).__name__}")
        kt, vt = args
        return {_coerce(k, kt, f"{key}.{k}"): _coerce(v, vt, f"{key}.{k}") for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise UserError(f"config key '{key}': expected a list, got {type(value).__name__}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"config key '{key}': expected true or false, got {value!r}")
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is int and isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)  # dict keys from YAML/env may arrive as strings
    if tp is str and isinstance(value, str):
        return value
    # A secret's value is never shown, not even the wrong one (an unquoted 123456).
    shown = f"a value of type {type(value).__name__}" if is_secret(key) or key.endswith("_token") else repr(value)
    raise UserError(f"config key '{key}': expected {_type_name(tp)}, got {shown}")


def _build(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else ""
            raise UserError(f"config key '{prefix}{key}' is not known{hint}")
        kwargs[key] = _coerce(value, hints[key], prefix + key)
    return cls(**kwargs)


def _merge(base: dict, extra: Mapping) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def load_config(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> WorkerConfig:
    """File < environment < explicit overrides (CLI flags). Validated."""
    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise UserError(f"config file not found: {p}")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise UserError(f"config file {p} is not valid YAML: {str(exc).splitlines()[0]}") from None
        if not isinstance(loaded, dict):
            raise UserError(f"config file {p}: the top level must be a mapping")
        data = loaded
    data = _merge(data, env_overrides(os.environ if environ is None else environ, WorkerConfig))
    data = _merge(data, overrides or {})
    cfg = _build(WorkerConfig, data)
    validate(cfg)
    return cfg
