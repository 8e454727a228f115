"""`-X key=value` (kcat's convention) on the commands that talk to Kafka: each goes
into `kafka.common`, so every client the command makes gets it."""

from __future__ import annotations

import argparse

from consumers.client_settings import parse_x
from consumers.profiles import PROFILES
from pipeline.config import KafkaOverrides

# What a command that cannot reach or get into Kafka exits with: require_kafka raises a
# UserError (consumers/kafka_reachable.py), which pipeline/cli.py prints as one line.
EXIT_NO_KAFKA = 2


def connect_timeout_help(default: str, scope: str = "") -> str:
    """The help of a --connect-timeout flag; `default` as the help rule writes it."""
    return f"{scope}exit {EXIT_NO_KAFKA} when no broker answers within this ({default})"


def add_broker_profile_flag(
    p: argparse.ArgumentParser, default: str | None, default_help: str, what: str = "the broker's client settings"
) -> None:
    """--broker-profile, its choices and their meaning from consumers/profiles.py PROFILES.
    `default_help`: the default as the help rule writes it (tests/unit/test_cli_help.py)."""
    meanings = ", ".join(f"{name} for {broker}" for name, broker in PROFILES.items())
    p.add_argument(
        "--broker-profile", choices=tuple(PROFILES), default=default,
        help=f"{what}: {meanings} (docs/BROKERS.md; default: {default_help})",
    )


def add_x_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-X", dest="kafka_settings", action="append", default=[], metavar="KEY=VALUE",
        help="librdkafka setting for every Kafka client (repeatable), e.g. -X security.protocol=SASL_SSL; "
        "secrets may be ${ENV_VAR} or @file:/path",
    )


def kafka_block(args: argparse.Namespace, base: KafkaOverrides | None = None) -> KafkaOverrides:
    """`base` (the config file's block, if any) with the -X settings on top of its common."""
    base = base or KafkaOverrides()
    common = {**base.common, **parse_x(args.kafka_settings)}
    return KafkaOverrides(common=common, consumer=base.consumer, producer=base.producer, admin=base.admin)
