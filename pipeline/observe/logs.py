"""How tidebatch's own log lines look: level and format (`text`, or one JSON object per
line for log collectors such as Loki, Elasticsearch or Cloud Logging).

The level and format come from `--log-level` / `--log-format` (before or after the
subcommand, pipeline/cli.py), else the worker config's `log_level` / `log_format`
(`TIDEBATCH_LOG_LEVEL`, `TIDEBATCH_LOG_FORMAT`), else INFO and text. An unknown level
is refused: it used to become INFO without a word.

Every line, in either format and at every level, passes through
consumers/secret_values.py `scrub` once it is formatted: a secret the process resolved
never reaches the log, whoever wrote the text (librdkafka's debug lines, an exception's
message, a traceback).
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime

import orjson

from consumers.secret_values import scrub, scrub_log_records

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class ScrubbingFormatter(logging.Formatter):
    """TEXT_FORMAT lines with every known secret masked."""

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601 with ms), level, logger, message,
    and the exception's traceback as one string when there is one; `process` with a
    child of `run --processes N`."""

    def __init__(self, process: int | None = None) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.process is not None:
            doc["process"] = self.process
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return scrub(orjson.dumps(doc, default=str).decode())


def configure(level: str = "INFO", fmt: str = "text", process: int | None = None) -> None:
    """(Re)configure the root logger: one stderr handler with `fmt`, at `level`.
    `process`: a child of `run --processes N`, whose lines say which (`[p1]`)."""
    scrub_log_records()
    handler = logging.StreamHandler(sys.stderr)
    text = TEXT_FORMAT if process is None else TEXT_FORMAT.replace(" %(name)s", f" [p{process}] %(name)s")
    handler.setFormatter(JsonFormatter(process) if fmt == "json" else ScrubbingFormatter(text))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler], force=True)
