"""librdkafka settings (the `kafka:` block) → kafka-python keyword arguments.

kafka-python cannot take librdkafka's names, and silently dropping one (a TLS CA, a
SASL mechanism) would connect insecurely or not at all; so the names it can honour
are translated, and any other dotted name is refused with one line naming it.
Undotted names are kafka-python's own keyword arguments and pass through.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.errors import UserError

_TRANSLATED: dict[str, str] = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",  # librdkafka's older alias
    # kafka-python uses the "plain" credentials for PLAIN and SCRAM alike.
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
}


def kafka_python_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """kafka-python kwargs for `settings`; UserError names the first it cannot honour."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if key in _TRANSLATED:
            upper = key.startswith(("security.", "sasl.mechanism"))  # librdkafka: any case
            out[_TRANSLATED[key]] = str(value).upper() if upper else value
        elif "." in key:
            raise UserError(
                f"Kafka setting {key} is not supported by client kafka-python "
                f"(it honours {', '.join(sorted(_TRANSLATED))}); use client confluent"
            )
        else:
            out[key] = value
    return out


def librdkafka_check_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """What librdkafka needs to check the connection a kafka-python client of
    `settings` will make: the start-up check runs through librdkafka for both clients
    (pipeline/app/serve.py). The dotted names are librdkafka's already; kafka-python's own
    keywords are left out, but for `ssl_check_hostname: false`, which librdkafka says
    as ssl.endpoint.identification.algorithm none (else the check would refuse a
    certificate kafka-python accepts)."""
    out = {k: v for k, v in settings.items() if "." in k}
    if str(settings.get("ssl_check_hostname", True)).lower() in ("false", "0", "no"):
        out["ssl.endpoint.identification.algorithm"] = "none"
    return out
