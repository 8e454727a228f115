"""`-X key=value` (kcat's convention) on the commands that talk to Kafka: each goes
into `kafka.common`, so every client the command makes gets it."""

from __future__ import annotations

import argparse

from consumers.client_settings import parse_x
from pipeline.config import KafkaOverrides


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
