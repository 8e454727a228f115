"""aiokafka's debug lines without the SASL exchange in them.

At debug level (`faust worker -l debug`) aiokafka logs every request and response of
a connection whole (aiokafka/conn.py: "Request to HOST:PORT N: <struct>"), the login
included: SaslAuthenticateRequest's `sasl_auth_bytes` is, for SASL PLAIN,
b'\\x00<user>\\x00<password>' -- a Confluent Cloud API secret in clear text in the
worker's log -- and for SCRAM the client's proof. The filter here replaces that field
of every such line with `***`; the rest of the line stays.
"""

from __future__ import annotations

import logging

AIOKAFKA_CONN_LOGGER = "aiokafka.conn"
FIELD = "sasl_auth_bytes"
HIDDEN = f"{FIELD}=***"


class SaslTokenFilter(logging.Filter):
    """Rewrites a record one of whose arguments has a `sasl_auth_bytes` field."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        tokens = [getattr(a, FIELD) for a in args if getattr(a, FIELD, None) is not None]
        if not tokens:
            return True
        from aiokafka.protocol.types import Bytes  # how the struct's repr shows the field

        message = record.getMessage()
        for token in tokens:
            message = message.replace(f"{FIELD}={Bytes.repr(token)}", HIDDEN)
        record.msg, record.args = message, ()
        return True


def hide_sasl_tokens(logger_name: str = AIOKAFKA_CONN_LOGGER) -> None:
    """Install the filter on aiokafka's connection logger (once). A logger's filters see
    the records that logger makes, whatever handlers Faust sets up later."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, SaslTokenFilter) for f in logger.filters):
        logger.addFilter(SaslTokenFilter())
